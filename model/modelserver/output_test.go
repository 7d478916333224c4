package modelserver

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/vramq/vramq/internal/testenv/fakeoai"
	"github.com/vramq/vramq/job"
)

// The mean and variance of what a sequence holds of its output in flight:
// for answers all of L tokens, L/2 and L²/12; an answer is counted at no
// more than the request's max_tokens.
func TestOutputsHeld(t *testing.T) {
	o := newOutputs()
	if _, _, _, ok := o.held("k", 100); ok {
		t.Fatal("learned from no answers")
	}
	for range outputSamples {
		o.done("k", o.start("k"), 2*60, 2) // n=2: 60 tokens a sequence
	}
	mean, v, _, ok := o.held("k", 1000)
	if !ok || math.Abs(mean-30) > 1e-9 || math.Abs(v-300) > 1e-9 {
		t.Errorf("held = %v, %v, %v; want 30 and 300 (60/2, 60²/12)", mean, v, ok)
	}
	if mean, _, _, _ := o.held("k", 20); math.Abs(mean-10) > 1e-9 {
		t.Errorf("held capped at 20 tokens = %v; want 10", mean)
	}
}

// The first answers of a run are its shortest: an answer counts only once
// every request of its kind sent before it has been answered, so the
// lengths learned are those of all the requests sent over a time.
func TestOutputsLearnByCohort(t *testing.T) {
	o := newOutputs()
	long := o.start("k")
	for range outputSamples {
		o.done("k", o.start("k"), 10, 1)
	}
	if _, _, _, ok := o.held("k", 1000); ok {
		t.Fatal("learned from the short answers while a request sent before them was in flight")
	}
	o.done("k", long, 1000, 1)
	mean, _, _, ok := o.held("k", 1000)
	// (8×10² + 1000²) / 2(8×10 + 1000)
	if want := (8*100.0 + 1e6) / (2 * 1080); !ok || math.Abs(mean-want) > 1e-9 {
		t.Errorf("held = %v, %v; want %v, the long answer with the short", mean, ok, want)
	}
	// A request that failed is not waited for.
	failed := o.start("k")
	o.done("k", o.start("k"), 10, 1)
	o.done("k", failed, 0, 0)
	if got := len(o.kinds["k"].l); got != outputSamples+2 {
		t.Errorf("%d answers counted after a failed request ended; want %d", got, outputSamples+2)
	}
	// Nor is one that stays in flight past outputPending answers.
	stuck := o.start("j")
	for range outputPending + 1 {
		o.done("j", o.start("j"), 5, 1)
	}
	if _, _, _, ok := o.held("j", 1000); !ok {
		t.Errorf("nothing learned from %d answers sent after a request still in flight", outputPending+1)
	}
	o.done("j", stuck, 5, 1)
}

// Against vLLM's metrics, a chat item is charged prompt + max_tokens until
// answers of its kind are in, then its prompt and what its output holds on
// average with a headroom: never more than prompt + max_tokens, never less
// than its prompt.
func TestCostLearnsOutputsFromUsage(t *testing.T) {
	fc := fakeoai.Config{TokenLatency: time.Millisecond}
	inBubble(t, fc, Config{MaxOutputTokens: 1000}, func(t *testing.T, s *fakeoai.Server, m *Model) {
		const text = "[[len=40]] say something"
		prompt := int64(fakeoai.ChatPromptTokens([]fakeoai.Message{{Role: "user", Content: text}}))
		item := chatItem("a", text, 512)
		worst := m.Cost("", []job.Item{item})
		if worst < prompt+512 {
			t.Fatalf("Cost before any answer = %d; want prompt + max_tokens, at least %d", worst, prompt+512)
		}
		items := make([]job.Item, 2*outputSamples)
		for i := range items {
			items[i] = chatItem(fmt.Sprint(i), text, 512)
		}
		outs, err := m.Run(t.Context(), "", items)
		if err != nil {
			t.Fatal(err)
		}
		wantOK(t, outs)
		// 40 tokens: 20 held on average, 8 of a half block, a headroom of
		// 3 standard deviations shared over the pool (a few tokens), and
		// the prompt counted from its bytes, tightened by usage.
		got := m.Cost("", []job.Item{item})
		if got < prompt+28 || got > 2*prompt+40 {
			t.Errorf("Cost after %d answers of 40 tokens = %d; want the prompt (%d tokens) + about 28", len(items), got, prompt)
		}
		capped := chatItem("c", text, 5)
		if got, most := m.Cost("", []job.Item{capped}), m.counter.tokens("/v1/chat/completions fake-model", m.mustParse(t, capped).prompt)+5; got > most || got < prompt {
			t.Errorf("Cost with max_tokens 5 = %d; want at most prompt + 5 = %d, at least the prompt %d", got, most, prompt)
		}
		// Answers of no output at all: the charge is still the prompt.
		const empty = "[[len=0]] nothing"
		for i := range 2 * outputSamples {
			if _, err := m.Run(t.Context(), "", []job.Item{chatItem(fmt.Sprint("e", i), empty, 512)}); err != nil {
				t.Fatal(err)
			}
		}
		ep := int64(fakeoai.ChatPromptTokens([]fakeoai.Message{{Role: "user", Content: empty}}))
		if got := m.Cost("", []job.Item{chatItem("e", empty, 512)}); got < ep {
			t.Errorf("Cost after answers of no output = %d; want at least the prompt, %d", got, ep)
		}
	})
}

func (m *Model) mustParse(t *testing.T, it job.Item) *request {
	t.Helper()
	r, refused := m.parse("", it)
	if refused != nil {
		t.Fatalf("parse %s: %v", it.ID, refused)
	}
	return r
}

// A server whose KV cache is not followed (TGI, which reserves prompt +
// max_new_tokens up front) is charged prompt + max_tokens, whatever the
// answers show.
func TestCostWithoutMetricsKeepsMaxTokens(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := fakeoai.NewUnstarted(fakeoai.Config{})
		defer s.Close()
		m, err := Open(t.Context(), Config{BaseURL: s.URL(), HTTPClient: httpClient(handlerTransport{h: http404For("/metrics", s)}),
			Models: []string{"fake-model"}, Logger: quiet(), KVCacheTokens: 100000})
		if err != nil {
			t.Fatal(err)
		}
		item := chatItem("a", "[[len=5]] hi", 300)
		for i := range 2 * outputSamples {
			if _, err := m.Run(t.Context(), "", []job.Item{chatItem(fmt.Sprint(i), "[[len=5]] hi", 300)}); err != nil {
				t.Fatal(err)
			}
		}
		if got, want := m.Cost("", []job.Item{item}), m.tokens(m.mustParse(t, item)); got != want {
			t.Errorf("Cost after answers of 5 tokens = %d; want the prompt + 300, %d", got, want)
		}
	})
}

// stubMetrics serves vLLM's metrics as set, and the rest from a fake.
type stubMetrics struct {
	mu                        sync.Mutex
	usage, waiting, preempted float64
}

func (st *stubMetrics) set(usage, waiting, preempted float64) {
	st.mu.Lock()
	st.usage, st.waiting, st.preempted = usage, waiting, preempted
	st.mu.Unlock()
}

func (st *stubMetrics) handler(s *fakeoai.Server) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/metrics" {
			s.ServeHTTP(w, r)
			return
		}
		st.mu.Lock()
		defer st.mu.Unlock()
		var b strings.Builder
		fmt.Fprintf(&b, "# TYPE vllm:cache_config_info gauge\nvllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"1000\"} 1\n")
		fmt.Fprintf(&b, "# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{engine=\"0\"} %g\n", st.usage)
		fmt.Fprintf(&b, "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{engine=\"0\"} %g\n", st.waiting)
		fmt.Fprintf(&b, "# TYPE vllm:num_preemptions_total counter\nvllm:num_preemptions_total{engine=\"0\"} %g\n", st.preempted)
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		_, _ = w.Write([]byte(b.String()))
	})
}

// Retraction: what the subscriber's budget takes from the device (free +
// working) is the pool less its usage; requests waiting for blocks make it
// none; a preemption halves the pool admission may fill, given back a step
// at a time once no preemption follows.
func TestDeviceRetractsOnPreemptionAndWaiting(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := fakeoai.NewUnstarted(fakeoai.Config{})
		defer s.Close()
		st := &stubMetrics{}
		const age = time.Second
		m, d, err := openKV(t.Context(), Config{BaseURL: s.URL(), HTTPClient: httpClient(handlerTransport{h: st.handler(s)}),
			Models: []string{"fake-model"}, Logger: quiet(), MetricsMaxAge: age})
		if err != nil {
			t.Fatal(err)
		}
		const pool = 16000
		budget := func(usage, waiting, preempted float64) int64 {
			t.Helper()
			st.set(usage, waiting, preempted)
			time.Sleep(age)
			mem, err := d.Read()
			if err != nil {
				t.Fatal(err)
			}
			if mem.Total != pool {
				t.Fatalf("total %d, want %d", mem.Total, pool)
			}
			return mem.Free + m.Working()
		}
		if got := budget(0.5, 0, 0); got != pool/2 {
			t.Errorf("half used: %d, want %d", got, pool/2)
		}
		if got := budget(0.5, 3, 0); got != pool/2 {
			t.Errorf("half used, requests waiting for a step: %d, want %d (not a sign of a full cache)", got, pool/2)
		}
		if got := budget(0.98, 2, 0); got != 0 {
			t.Errorf("requests waiting with the cache at 0.98: %d, want 0", got)
		}
		if got := budget(0.98, 0, 0); got != pool*2/100 {
			t.Errorf("no more waiting: %d, want %d", got, pool*2/100)
		}
		if got := budget(0.3, 0, 4); got != pool/2-pool*3/10 {
			t.Errorf("after preemptions: %d, want half the pool less the usage, %d", got, pool/2-pool*3/10)
		}
		if got := budget(0.3, 0, 4); got != pool/2-pool*3/10 {
			t.Errorf("the reading after: %d, want the share held, %d", got, pool/2-pool*3/10)
		}
		time.Sleep(retractHoldAges * age)
		if got, want := budget(0.3, 0, 4), int64((0.5+retractStep)*pool)-pool*3/10; got != want {
			t.Errorf("after %v without preemption: %d, want a step back, %d", retractHoldAges*age, got, want)
		}
		for range 10 {
			time.Sleep(retractHoldAges * age)
			budget(0.3, 0, 4)
		}
		if got := budget(0.3, 0, 4); got != pool-pool*3/10 {
			t.Errorf("long after: %d, want the whole pool less the usage, %d", got, pool-pool*3/10)
		}
		if got := budget(0.3, 0, 9); got != pool/2-pool*3/10 {
			t.Errorf("preempting again: %d, want %d", got, pool/2-pool*3/10)
		}
	})
}

// End to end against the fake's scheduler: a pool too small for what is
// sent to it directly preempts, and the device's budget halves.
func TestDeviceRetractsOnTheFakesPreemption(t *testing.T) {
	fc := fakeoai.Config{NumGPUBlocks: 20, BlockSize: 16, MaxModelLen: 320, TokenLatency: 10 * time.Millisecond}
	synctest.Test(t, func(t *testing.T) {
		s := fakeoai.NewUnstarted(fc)
		defer s.Close()
		m, d, err := openKV(t.Context(), Config{BaseURL: s.URL(), HTTPClient: s.Client(), Models: []string{"fake-model"}, Logger: quiet(),
			MetricsMaxAge: time.Nanosecond})
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		for i := range 2 {
			wg.Go(func() {
				body := fmt.Sprintf(`{"model":"fake-model","max_tokens":250,"messages":[{"role":"user","content":"[[len=250]] %d"}]}`, i)
				req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, s.URL()+"/v1/chat/completions", strings.NewReader(body))
				req.Header.Set("Content-Type", "application/json")
				resp, err := s.Client().Do(req)
				if err != nil {
					t.Error(err)
					return
				}
				resp.Body.Close()
			})
		}
		if _, err := d.Read(); err != nil {
			t.Fatal(err)
		}
		wg.Wait()
		if s.Stats().Preemptions == 0 {
			t.Fatal("the fake did not preempt")
		}
		mem, err := d.Read()
		if err != nil {
			t.Fatal(err)
		}
		if got, want := mem.Free+m.Working(), mem.Total/2; got != want {
			t.Errorf("after the fake preempted: budget %d (%+v), want half the pool, %d", got, mem, want)
		}
	})
}

// Output lengths are learned per prompt-length cohort: when short prompts
// get long answers and long prompts short ones, each is charged its own
// cohort's, not the mean of both; a cohort not seen yet is charged its
// kind's.
func TestCostLearnsOutputsByPromptCohort(t *testing.T) {
	fc := fakeoai.Config{TokenLatency: time.Millisecond}
	inBubble(t, fc, Config{MaxOutputTokens: 1000}, func(t *testing.T, s *fakeoai.Server, m *Model) {
		short := "[[len=400]] a short question"
		long := "[[len=4]] summarise" + strings.Repeat(" word", 300)
		var items []job.Item
		for i := range 2 * outputSamples {
			items = append(items, chatItem(fmt.Sprint("s", i), short, 512), chatItem(fmt.Sprint("l", i), long, 512))
		}
		outs, err := m.Run(t.Context(), "", items)
		if err != nil {
			t.Fatal(err)
		}
		wantOK(t, outs)
		prompt := func(text string) int64 {
			return int64(fakeoai.ChatPromptTokens([]fakeoai.Message{{Role: "user", Content: text}}))
		}
		// A short prompt holds about 200 tokens of its 400-token answer;
		// a long one 2 of its 4. Pooled, both would hold about 200 (long
		// answers weigh the held mean by their length).
		if got := m.Cost("", []job.Item{chatItem("s", short, 512)}) - prompt(short); got < 180 {
			t.Errorf("a short prompt's output charge = %d; want its cohort's, about 200 or more", got)
		}
		if got := m.Cost("", []job.Item{chatItem("l", long, 512)}) - prompt(long); got > 60 {
			t.Errorf("a long prompt's output charge = %d; want its cohort's, a few tokens", got)
		}
		// A prompt of a length not seen is charged the kind's lengths.
		mid := "[[len=4]] medium" + strings.Repeat(" word", 60)
		if got := m.Cost("", []job.Item{chatItem("m", mid, 512)}); got >= prompt(mid)+512 {
			t.Errorf("an unseen cohort's charge = %d; want the kind's lengths, below prompt + max_tokens %d", got, prompt(mid)+512)
		}
	})
}

// The headroom of a charge learned from few answers holds their mean's
// error too, which every request in flight shares: with the same lengths
// (10 and 90 tokens, alternately), the charge after outputSamples answers
// is above the charge after a window's worth.
func TestCostHeadroomShrinksAsAnswersAccrue(t *testing.T) {
	fc := fakeoai.Config{TokenLatency: time.Millisecond}
	inBubble(t, fc, Config{MaxOutputTokens: 1000}, func(t *testing.T, s *fakeoai.Server, m *Model) {
		texts := []string{"[[len=10]] say something", "[[len=90]] say something"}
		ask := func(n int) {
			items := make([]job.Item, n)
			for i := range items {
				items[i] = chatItem(fmt.Sprint(i), texts[i%2], 512)
			}
			outs, err := m.Run(t.Context(), "", items)
			if err != nil {
				t.Fatal(err)
			}
			wantOK(t, outs)
		}
		item := chatItem("probe", texts[0], 512)
		ask(outputSamples)
		few := m.Cost("", []job.Item{item})
		ask(outputWindow - outputSamples)
		many := m.Cost("", []job.Item{item})
		if few <= many {
			t.Fatalf("charge after %d answers %d, after %d %d; want the first above the second", outputSamples, few, outputWindow, many)
		}
		t.Logf("charge after %d answers %d, after %d %d", outputSamples, few, outputWindow, many)
	})
}
