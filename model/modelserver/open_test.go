package modelserver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/vramq/vramq/gpu"
	"github.com/vramq/vramq/internal/testenv/fakeoai"
	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/job/fault"
	"github.com/vramq/vramq/model/backend"
)

func TestConfigValidateJoinsErrors(t *testing.T) {
	err := Config{BaseURL: "ftp://x", MaxConcurrency: -1, TPM: -5, APIKey: "k", APIKeyFile: "f", Models: []string{" m"}}.Validate()
	for _, want := range []string{"base URL", "max concurrency -1", "TPM -5", "an API key and an API key file", `model name " m"`} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate: %v; want it to say %q", err, want)
		}
	}
	if err := (Config{BaseURL: "http://u:p@h", Models: []string{"m"}}).Validate(); err == nil || strings.Contains(err.Error(), ":p@") {
		t.Errorf("credentials in the URL: %v; want refused, without them in the error", err)
	}
	if err := (Config{BaseURL: "http://localhost:8000/v1", Models: []string{"m"}}).Validate(); err != nil {
		t.Errorf("a valid config: %v", err)
	}
}

// The key is sent, and never logged, whether from the config or a file.
func TestAPIKeyNeverLogged(t *testing.T) {
	const key = "sk-test-0123456789abcdef"
	file := filepath.Join(t.TempDir(), "key")
	if err := os.WriteFile(file, []byte(key+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, cfg := range []Config{{APIKey: key}, {APIKeyFile: file}} {
		synctest.Test(t, func(t *testing.T) {
			s := fakeoai.NewUnstarted(fakeoai.Config{APIKey: key})
			defer s.Close()
			var logs strings.Builder
			var mu sync.Mutex
			cfg.Logger = slog.New(slog.NewTextHandler(lockedWriter{&mu, &logs}, &slog.HandlerOptions{Level: slog.LevelDebug}))
			m := openOn(t, s, cfg)
			outs, err := m.Run(t.Context(), "", []job.Item{chatItem("c", "x", 2)})
			if err != nil {
				t.Fatal(err)
			}
			wantOK(t, outs)
			mu.Lock()
			defer mu.Unlock()
			if strings.Contains(logs.String(), key) || !strings.Contains(logs.String(), "model server ready") {
				t.Errorf("logs:\n%s\nwant the start logged, without the key", logs.String())
			}
		})
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	b  *strings.Builder
}

func (w lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

// Open stops with a clear error when the server refuses the key, has no
// /v1/models, or does not serve a configured model.
func TestOpenProbes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := fakeoai.NewUnstarted(fakeoai.Config{APIKey: "right", Models: []string{"a", "b"}})
		defer s.Close()
		open := func(cfg Config) error {
			cfg.HTTPClient, cfg.Logger = s.Client(), quiet()
			if cfg.BaseURL == "" {
				cfg.BaseURL = s.URL()
			}
			_, err := Open(context.Background(), cfg)
			return err
		}
		if err := open(Config{Models: []string{"a"}, APIKey: "wrong"}); !errors.Is(err, fault.ErrNeedsOperator) || !strings.Contains(err.Error(), "API key") {
			t.Errorf("a wrong key: %v", err)
		}
		if err := open(Config{Models: []string{"a", "c"}, APIKey: "right"}); err == nil || !strings.Contains(err.Error(), `does not serve ["c"]`) {
			t.Errorf("a model the server does not have: %v", err)
		}
		if err := open(Config{BaseURL: s.URL() + "/nowhere", Models: []string{"a"}, APIKey: "right"}); err == nil || !strings.Contains(err.Error(), "404") {
			t.Errorf("a URL without /v1/models: %v", err)
		}
		if err := open(Config{BaseURL: s.URL() + "/v1/", Models: []string{"a", "b"}, APIKey: "right"}); err != nil {
			t.Errorf("the base URL with /v1: %v", err)
		}
	})
}

// With a WordPiece tokenizer.json, embedding inputs are counted exactly
// (model/bert's tokenizer, [CLS] and [SEP] included); another kind of
// tokenizer leaves the byte bound.
func TestTokenizerCountsExactly(t *testing.T) {
	tok := "../wordpiece/testdata/tokenizer/tokenizer.json"
	inBubble(t, fakeoai.Config{}, Config{Tokenizer: tok}, func(t *testing.T, s *fakeoai.Server, m *Model) {
		if m.counter.wp == nil {
			t.Fatal("the WordPiece tokenizer was not loaded")
		}
		text := "The quick brown fox jumps over the lazy dog."
		want := int64(len(m.counter.wp.Encode(text, 0)))
		if got := m.Cost("", []job.Item{embedItem("e", text)}); got != want {
			t.Errorf("Cost %d, want the exact count %d", got, want)
		}
	})
	bpe := filepath.Join(t.TempDir(), "tokenizer.json")
	if err := os.WriteFile(bpe, []byte(`{"model":{"type":"BPE","vocab":{"a":0}}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	inBubble(t, fakeoai.Config{}, Config{Tokenizer: bpe}, func(t *testing.T, s *fakeoai.Server, m *Model) {
		if m.counter.wp != nil {
			t.Error("a BPE tokenizer was taken for WordPiece")
		}
	})
}

// The KV cache the backend owns (its Memory) follows vLLM's metrics:
// capacity from cache_config_info, free the pool less kv_cache_usage_perc,
// and the working set is the KV of the requests in flight, no more than the
// cache holds.
func TestKVCacheFollowsTheServersMetrics(t *testing.T) {
	fc := fakeoai.Config{NumGPUBlocks: 600, BlockSize: 16, MaxModelLen: 4096, TokenLatency: 10 * time.Millisecond}
	synctest.Test(t, func(t *testing.T) {
		s := fakeoai.NewUnstarted(fc)
		defer s.Close()
		cfg := Config{BaseURL: s.URL(), HTTPClient: s.Client(), Models: []string{"fake-model"}, Logger: quiet(),
			MetricsMaxAge: time.Nanosecond}
		m, d, err := openKV(t.Context(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		mem, err := d.Read()
		room := int64(600 * 16)
		if want := int64(600 * 16); err != nil || mem.Total != want || mem.Free != room || d.Simulated() || d.Unit() != backend.KVTokens {
			t.Fatalf("idle: %+v (%v), %v; want %d KV tokens total and %d free, read from the server", mem, d.Unit(), err, want, room)
		}
		done := make(chan struct{})
		go func() {
			defer close(done)
			if _, err := m.Run(context.Background(), "", []job.Item{chatItem("long", "[[len=2000]] write", 2000)}); err != nil {
				t.Error(err)
			}
		}()
		time.Sleep(5 * time.Second) // 500 tokens generated
		mem, err = d.Read()
		st := s.Stats()
		used := int64(st.KVBlocksUsed) * 16
		if err != nil || mem.Used != used || mem.Free != room-used || used == 0 {
			t.Errorf("mid-run: %+v, %v; want %d used (%d blocks)", mem, err, used, st.KVBlocksUsed)
		}
		if w := m.Working(); w != used || mem.Process != used {
			t.Errorf("working set %d (process %d); want the %d KV tokens the request holds now, below its reservation", w, mem.Process, used)
		}
		<-done
		if w := m.Working(); w != 0 {
			t.Errorf("working set %d after the run; want 0", w)
		}
	})
}

// Without metrics the KV cache is its configured tokens in flight, all free.
func TestKVCacheWithoutMetrics(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := fakeoai.NewUnstarted(fakeoai.Config{})
		defer s.Close()
		h := handlerTransport{h: http404For("/metrics", s)}
		m, d, err := openKV(t.Context(), Config{BaseURL: s.URL(), HTTPClient: httpClient(h), Models: []string{"fake-model"}, Logger: quiet(),
			TokensInFlight: 5000})
		if err != nil {
			t.Fatal(err)
		}
		mem, err := d.Read()
		if err != nil || mem.Total != 5000 || mem.Free != 5000 || !d.Simulated() || m.Working() != 0 {
			t.Errorf("%+v, %v, working %d; want 5000 tokens, all free, accounted by vramq", mem, err, m.Working())
		}
	})
}

// The model server is no device: its KV cache is the Memory the backend
// owns (backend.MemoryOwner), which the subscriber reads its budget from
// with no Config.Device, and neither it nor the model is a gpu.Device.
func TestKVCacheIsTheBackendsMemory(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := fakeoai.NewUnstarted(fakeoai.Config{})
		defer s.Close()
		h := handlerTransport{h: http404For("/metrics", s)}
		m, err := Open(t.Context(), Config{BaseURL: s.URL(), HTTPClient: httpClient(h), Models: []string{"fake-model"}, Logger: quiet(),
			TokensInFlight: 5000})
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		var b backend.Backend = m
		if o, ok := b.(backend.MemoryOwner); !ok || o.Memory() != backend.Memory(m.dev) {
			t.Fatalf("the model server's backend does not own its KV cache as its Memory")
		}
		if _, ok := any(m.Memory()).(gpu.Device); ok {
			t.Error("the KV cache is a gpu.Device")
		}
		if _, ok := any(m).(gpu.Device); ok {
			t.Error("the model is a gpu.Device")
		}
	})
}

// The rate limits bound admission in tokens of their own
// (backend.RateTokens), not the KV cache's: what the configured ones
// pass in half of MaxWait, from the start, so that the subscriber never
// admits more than finishes before its batches' waits run out. With none
// configured, until the server's first answer says what its limits are,
// it is the concurrency's worth of requests at the output ceiling; a
// server whose answers carry no limits leaves them unbounded after
// (rateMost). The KV cache's memory is its capacity all along.
func TestOfferFollowsTheRateLimits(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := fakeoai.NewUnstarted(fakeoai.Config{})
		defer s.Close()
		h := handlerTransport{h: http404For("/metrics", s)}
		for _, tc := range []struct {
			tpm, rpm      int
			before, after int64
		}{
			{0, 0, 16 * 100, rateMost},    // none configured
			{1200, 0, 600, 600},           // 1,200 tokens a minute for 30 s
			{1200, 10, 500, 500},          // 10 requests a minute for 30 s, of at most 100 tokens
			{0, 100000, 5000000, 5000000}, // 100,000 requests a minute for 30 s, of at most 100 tokens
		} {
			m, d, err := openKV(t.Context(), Config{BaseURL: s.URL(), HTTPClient: httpClient(h), Models: []string{"fake-model"}, Logger: quiet(),
				TPM: tc.tpm, RPM: tc.rpm, MaxOutputTokens: 100, TokensInFlight: 1 << 20, MaxWait: time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			check := func(when string, want int64) {
				t.Helper()
				if now, most := m.Offers(); now[backend.RateTokens] != want || most[backend.RateTokens] != rateMost {
					t.Errorf("TPM %d, RPM %d, %s: %d rate tokens of at most %d offered; want %d of %d",
						tc.tpm, tc.rpm, when, now[backend.RateTokens], most[backend.RateTokens], want, int64(rateMost))
				}
				if mem, err := d.Read(); err != nil || mem.Total != 1<<20 || mem.Free != 1<<20 {
					t.Errorf("TPM %d, RPM %d, %s: %+v, %v; want all %d free: the limits are not memory", tc.tpm, tc.rpm, when, mem, err, 1<<20)
				}
			}
			check("before any answer", tc.before)
			if _, err := m.Run(t.Context(), "", []job.Item{chatItem("a", "[[len=4]] hello", 100)}); err != nil {
				t.Fatal(err)
			}
			check("after an answer with no limits", tc.after)
			m.Close()
		}
	})
}

// Two subscribers on one server with no limit configured: what each one's
// rate tokens offer follows the server's limits, learned from its headers,
// as its share of them. After the first answer it is what the limit passes
// in half of MaxWait plus what remains of the server's bucket; once the
// other takes most of the limit, it falls to what the other leaves.
func TestOfferSharesTheServersLimits(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// 6,000 tokens a minute: 3,000 in the 30 s of half of MaxWait.
		s := fakeoai.NewUnstarted(fakeoai.Config{Limits: fakeoai.RateLimits{TPM: 6000, RPM: 1000}})
		defer s.Close()
		h := handlerTransport{h: http404For("/metrics", s)}
		open := func() *Model {
			m, err := Open(t.Context(), Config{BaseURL: s.URL(), HTTPClient: httpClient(h), Models: []string{"fake-model"}, Logger: quiet(),
				MaxOutputTokens: 100, TokensInFlight: 1 << 20, MaxWait: time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { m.Close() })
			return m
		}
		a, b := open(), open()
		offered := func() int64 {
			now, _ := a.Offers()
			return now[backend.RateTokens]
		}
		if f := offered(); f != 16*100 {
			t.Errorf("before any answer: %d offered; want the concurrency's 16 requests of 100 tokens", f)
		}
		if _, err := a.Run(t.Context(), "", []job.Item{chatItem("a", "[[len=4]] hello", 100)}); err != nil {
			t.Fatal(err)
		}
		if f := offered(); f <= 3000 || f > 3000+6000 {
			t.Errorf("after an answer: %d offered; want what 6,000 TPM passes in 30 s and at most its whole bucket more", f)
		}
		// For five minutes b sends all it can, ten requests at a time,
		// and a one request every five seconds: the limit is used up,
		// most of it by b. (b, its estimate of a's use hidden by what the
		// bucket held at the start, paces itself as if alone, at the
		// limit a minute; with a's use beside it, the bucket's first
		// minute drains in about four.)
		ctx, stop := context.WithTimeout(t.Context(), 5*time.Minute)
		defer stop()
		done := make(chan struct{})
		go func() {
			defer close(done)
			for i := 0; ctx.Err() == nil; i++ {
				items := make([]job.Item, 10)
				for j := range items {
					items[j] = chatItem(fmt.Sprintf("b%d-%d", i, j), "[[len=4]] hello", 100)
				}
				_, _ = b.Run(ctx, "", items) // a backoff, or the end of the two minutes
			}
		}()
		for i := 0; ctx.Err() == nil; i++ {
			_, _ = a.Run(ctx, "", []job.Item{chatItem(fmt.Sprintf("a%d", i), "[[len=4]] hello", 100)})
			time.Sleep(5 * time.Second)
		}
		<-done
		if f := offered(); f >= 3000/2 {
			t.Errorf("with the other subscriber taking most of the limit: %d offered; want under half of what the limit passes in 30 s", f)
		}
	})
}

// Overload halves the requests in flight; clean full runs grow them back.
func TestConcurrencyHalvesAndGrowsBack(t *testing.T) {
	c := newConcurrency(8, quiet())
	var slots []slot
	for range 8 {
		s, _ := c.acquire(context.Background())
		slots = append(slots, s)
	}
	c.release(slots[0], true, false)
	c.release(slots[1], true, false) // the same overload: halves once
	if got := c.now(); got != 4 {
		t.Fatalf("after an overload: %d, want 4", got)
	}
	for _, s := range slots[2:] {
		c.release(s, false, true)
	}
	for i := 0; c.now() == 4; i++ {
		if i > 10*concurrencyCleanRun {
			t.Fatal("the bound never grew back")
		}
		var held []slot
		for range c.now() {
			s, _ := c.acquire(context.Background())
			held = append(held, s)
		}
		for _, s := range held {
			c.release(s, false, true)
		}
	}
	if got := c.now(); got != 5 {
		t.Errorf("grown to %d, want 5 (one step)", got)
	}
	// An overload at the new bound puts it back and doubles the wait.
	s, _ := c.acquire(context.Background())
	c.release(s, true, false)
	if got := c.now(); got != 4 || c.need != 2*concurrencyCleanRun {
		t.Errorf("after the step failed: bound %d, next step after %d; want 4 and %d", got, c.need, 2*concurrencyCleanRun)
	}
}

// Without KV metrics, the slots the subscriber may admit are what the
// server can run within half of MaxWait: two rounds of its concurrency
// before any answer and while requests are quick, one once they take more
// than a quarter of MaxWait each, and rounds of a halved concurrency after
// an overload. The most stays two rounds of the configured concurrency.
func TestSlotsFollowWhatRunsWithinTheWait(t *testing.T) {
	for _, tc := range []struct {
		name     string
		latency  time.Duration // a step: a request is a prefill and 10 tokens
		overload bool
		want     int64
	}{
		{name: "quick", latency: 100 * time.Millisecond, want: 32}, // 1.1 s a request
		{name: "slow", latency: 2 * time.Second, want: 16},         // 22 s a request: one round in 30 s
		{name: "overloaded", latency: 100 * time.Millisecond, overload: true, want: 16},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fc := fakeoai.Config{NoMetrics: true, TokenLatency: tc.latency, OutputTokens: func(string, int) int { return 10 }}
			if tc.overload {
				fc.Faults = []fakeoai.Fault{status(503, 1)}
			}
			inBubble(t, fc, Config{MaxWait: time.Minute}, func(t *testing.T, s *fakeoai.Server, m *Model) {
				if now, most := m.Offers(); now[backend.Slots] != 32 || most[backend.Slots] != 32 {
					t.Fatalf("before any answer: %d slots of at most %d; want 32 of 32", now[backend.Slots], most[backend.Slots])
				}
				if _, err := m.Run(t.Context(), "", []job.Item{chatItem("a", "x", 16), chatItem("b", "y", 16)}); err != nil {
					t.Fatal(err)
				}
				if now, most := m.Offers(); now[backend.Slots] != tc.want || most[backend.Slots] != 32 {
					t.Errorf("after the answers: %d slots of at most %d; want %d of 32", now[backend.Slots], most[backend.Slots], tc.want)
				}
			})
		})
	}
}
