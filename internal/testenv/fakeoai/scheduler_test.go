package fakeoai_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/vramq/vramq/internal/testenv/fakeoai"
)

// metrics scrapes /metrics into name{labels} → value lines.
func metrics(t *testing.T, s *fakeoai.Server) map[string]string {
	t.Helper()
	res, err := s.Client().Get(s.URL() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, line := range strings.Split(string(b), "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		out[line[:i]] = line[i+1:]
	}
	return out
}

func wantMetrics(t *testing.T, s *fakeoai.Server, want map[string]string) {
	t.Helper()
	got := metrics(t, s)
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %q, want %q", k, got[k], v)
		}
	}
}

// concurrently sends each body to path from a goroutine of its own, in a
// synctest bubble: each arrives once the server has done all it can with
// the ones before (the scheduler sleeps in a step), so that the order is
// known. It returns a function that waits for the answers' bodies.
func concurrently(t *testing.T, s *fakeoai.Server, path string, bodies ...string) func() []string {
	out := make([]string, len(bodies))
	var wg sync.WaitGroup
	for i, b := range bodies {
		wg.Go(func() {
			res, got := post(t, s, path, b)
			if res != nil && res.StatusCode != http.StatusOK {
				t.Errorf("request %d: %d %s", i, res.StatusCode, got)
			}
			out[i] = got
		})
		synctest.Wait()
	}
	return func() []string { wg.Wait(); return out }
}

const model = `model_name="fake-model"`

// Past max_num_seqs, sequences wait (vLLM's waiting queue); each choice of
// n is a sequence.
func TestMaxNumSeqs(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := fakeoai.NewUnstarted(fakeoai.Config{MaxNumSeqs: 2, TokenLatency: time.Second})
		defer s.Close()
		wait := concurrently(t, s, "/v1/completions",
			`{"model":"fake-model","prompt":"a [[len=3]]","max_tokens":3,"n":2}`,
			`{"model":"fake-model","prompt":"b [[len=3]]","max_tokens":3}`)
		time.Sleep(time.Second / 2)
		wantMetrics(t, s, map[string]string{
			"vllm:num_requests_running{engine=\"0\"," + model + "}": "2",
			"vllm:num_requests_waiting{engine=\"0\"," + model + "}": "1",
		})
		wait()
		st := s.Stats()
		if st.MaxRunning != 2 || st.Running != 0 || st.Waiting != 0 || st.CompletionTokens != 9 {
			t.Errorf("max running %d, now running %d waiting %d, completion tokens %d", st.MaxRunning, st.Running, st.Waiting, st.CompletionTokens)
		}
	})
}

// Blocks are taken as tokens are generated; when none is free, the last
// scheduled sequence is preempted, its tokens recomputed later, and the
// answers are the same.
func TestKVPreemption(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// Two sequences of 4 prompt + 8 generated tokens need 3 blocks of 4
		// each at the end; the pool has 5.
		s := fakeoai.NewUnstarted(fakeoai.Config{MaxModelLen: 16, BlockSize: 4, NumGPUBlocks: 5, TokenLatency: time.Second,
			OutputTokens: func(string, int) int { return 8 }})
		defer s.Close()
		body := `{"model":"fake-model","prompt":[1,2,3,4],"max_tokens":8}`
		wait := concurrently(t, s, "/v1/completions", body, body)
		// Steps run at 0s, 1s, ...: the first is scheduled at 0s, the second
		// at 1s, with 2 blocks each; at 4s the first takes the last free
		// block, and at 5s the second, wanting one, is preempted, freeing
		// its 2.
		time.Sleep(4*time.Second + time.Second/2)
		wantMetrics(t, s, map[string]string{
			"vllm:kv_cache_usage_perc{engine=\"0\"," + model + "}":   "1",
			"vllm:num_preemptions_total{engine=\"0\"," + model + "}": "0",
		})
		time.Sleep(time.Second)
		wantMetrics(t, s, map[string]string{
			"vllm:num_requests_running{engine=\"0\"," + model + "}":  "1",
			"vllm:num_requests_waiting{engine=\"0\"," + model + "}":  "1",
			"vllm:kv_cache_usage_perc{engine=\"0\"," + model + "}":   "0.6",
			"vllm:num_preemptions_total{engine=\"0\"," + model + "}": "1",
		})
		answers := wait()
		var got [2]struct {
			Choices []struct{ Text string }
			Usage   struct {
				CompletionTokens int `json:"completion_tokens"`
			}
		}
		for i, a := range answers {
			if err := json.Unmarshal([]byte(a), &got[i]); err != nil {
				t.Fatal(err)
			}
		}
		if got[0].Usage.CompletionTokens != 8 || got[1].Usage.CompletionTokens != 8 || got[0].Choices[0].Text != got[1].Choices[0].Text {
			t.Errorf("answers after a preemption: %+v", got)
		}
		st := s.Stats()
		if st.Preemptions != 1 || st.MaxKVBlocksUsed != 5 || st.KVBlocksUsed != 0 {
			t.Errorf("preemptions %d, max blocks %d, blocks now %d", st.Preemptions, st.MaxKVBlocksUsed, st.KVBlocksUsed)
		}
		if u := st.Minutes[0].KVUsage; u <= 0 || u >= 1 {
			t.Errorf("KV usage over the minute %v", u)
		}
	})
}

// The ledger's KV usage is the time-weighted fraction of the pool in use.
func TestKVUsageLedger(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := fakeoai.NewUnstarted(fakeoai.Config{MaxModelLen: 16, BlockSize: 4, NumGPUBlocks: 4, TokenLatency: 10 * time.Second,
			OutputTokens: func(string, int) int { return 6 }})
		defer s.Close()
		// 2 prompt tokens + 6 generated: 1 block for steps 1-2, 2 blocks
		// for steps 3-6 (each step 10s): 10 block-seconds × (2×1 + 4×2)
		// over 60s of 4 blocks = 100/240.
		post(t, s, "/v1/completions", completionBody("a b", 6))
		if diff := cmp.Diff(100.0/240, s.Stats().Minutes[0].KVUsage); diff != "" {
			t.Errorf("KV usage (-want +got):\n%s", diff)
		}
	})
}

// --max-num-queued-reqs bounds waiting + running sequences: past it, 503
// with no retry hint.
func TestMaxQueuedRequests(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := fakeoai.NewUnstarted(fakeoai.Config{MaxNumSeqs: 1, MaxQueuedRequests: 2, TokenLatency: time.Second})
		defer s.Close()
		wait := concurrently(t, s, "/v1/completions", completionBody("a", 4), completionBody("b", 4))
		res, got := post(t, s, "/v1/completions", completionBody("c", 4))
		if res.StatusCode != http.StatusServiceUnavailable || res.Header.Get("Retry-After") != "" || res.Header.Get("retry-after-ms") != "" {
			t.Errorf("third: %d %s, retry headers %q %q", res.StatusCode, got, res.Header.Get("Retry-After"), res.Header.Get("retry-after-ms"))
		}
		wait()
		if st := s.Stats(); st.QueueFull != 1 {
			t.Errorf("queue full %d", st.QueueFull)
		}
	})
}

// Past max_concurrent_requests TGI answers 429 "Model is overloaded", and
// TEI the same in its OpenAI-compatible shape.
func TestMaxConcurrentRequests(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := fakeoai.NewUnstarted(fakeoai.Config{MaxConcurrentRequests: 1, TokenLatency: time.Second})
		defer s.Close()
		wait := concurrently(t, s, "/v1/completions", completionBody("a", 4))
		res, got := post(t, s, "/v1/chat/completions", `{"model":"fake-model","messages":[{"role":"user","content":"hi"}]}`)
		if res.StatusCode != http.StatusTooManyRequests || got != `{"error":"Model is overloaded","error_type":"overloaded"}` {
			t.Errorf("chat: %d %s", res.StatusCode, got)
		}
		res, got = post(t, s, "/v1/embeddings", `{"model":"fake-model","input":"hi"}`)
		if res.StatusCode != http.StatusTooManyRequests || got != `{"message":"Model is overloaded","code":429,"type":"overloaded"}` {
			t.Errorf("embeddings: %d %s", res.StatusCode, got)
		}
		wait()
		if res, _ := post(t, s, "/v1/completions", completionBody("b", 1)); res.StatusCode != http.StatusOK {
			t.Errorf("once the first is done: %d", res.StatusCode)
		}
		if st := s.Stats(); st.Overloaded != 2 {
			t.Errorf("overloaded %d", st.Overloaded)
		}
	})
}

// A client that goes away frees its sequences and their blocks.
func TestClientGoesAway(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := fakeoai.NewUnstarted(fakeoai.Config{TokenLatency: time.Second})
		defer s.Close()
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() {
			defer close(done)
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.URL()+"/v1/completions", strings.NewReader(completionBody("a [[len=50]]", 50)))
			if _, err := s.Client().Do(req); err == nil {
				t.Error("a cancelled request answered")
			}
		}()
		time.Sleep(5 * time.Second)
		if st := s.Stats(); st.Running != 1 || st.KVBlocksUsed == 0 {
			t.Fatalf("running %d, blocks %d", st.Running, st.KVBlocksUsed)
		}
		cancel()
		<-done
		time.Sleep(time.Second + time.Second/2) // the next step takes it out
		if st := s.Stats(); st.Running != 0 || st.KVBlocksUsed != 0 {
			t.Errorf("after cancel: running %d, blocks %d", st.Running, st.KVBlocksUsed)
		}
	})
}

// Embeddings take one step and a slot, no KV blocks.
func TestEmbeddingsSchedule(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := fakeoai.NewUnstarted(fakeoai.Config{TokenLatency: time.Second})
		defer s.Close()
		start := time.Now()
		res, _ := post(t, s, "/v1/embeddings", `{"model":"fake-model","input":["a","b","c"]}`)
		if res.StatusCode != http.StatusOK || time.Since(start) != time.Second {
			t.Errorf("%d after %v", res.StatusCode, time.Since(start))
		}
		if st := s.Stats(); st.MaxRunning != 3 || st.MaxKVBlocksUsed != 0 {
			t.Errorf("max running %d, max blocks %d", st.MaxRunning, st.MaxKVBlocksUsed)
		}
	})
}

func TestMetricsNames(t *testing.T) {
	s := start(t, fakeoai.Config{Models: []string{"m"}, NumGPUBlocks: 1000})
	got := metrics(t, s)
	for _, re := range []string{
		`^vllm:num_requests_running\{engine="0",model_name="m"\}$`,
		`^vllm:num_requests_waiting\{engine="0",model_name="m"\}$`,
		`^vllm:kv_cache_usage_perc\{engine="0",model_name="m"\}$`,
		`^vllm:num_preemptions_total\{engine="0",model_name="m"\}$`,
		`^vllm:cache_config_info\{block_size="16",engine="0",num_gpu_blocks="1000"\}$`,
	} {
		found := false
		for k := range got {
			found = found || regexp.MustCompile(re).MatchString(k)
		}
		if !found {
			t.Errorf("no metric matches %s in %v", re, got)
		}
	}
}
