package subscriber

import (
	"context"
	"encoding/json"
	"log/slog"
	"testing"
	"testing/synctest"
	"time"

	"github.com/vramq/vramq/gpu"
	"github.com/vramq/vramq/internal/testenv/fakeoai"
	"github.com/vramq/vramq/internal/testenv/wait"
	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/model/modelserver"
)

// Delete makes memPayloads an answerBucket, for the answer store.
func (p *memPayloads) Delete(_ context.Context, key string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.objs, key)
	return nil
}

// A model server bounds the answers of one run by what a result may hold
// (modelserver.Config.ResultBytes): an answer past it fails its item
// (too_large) and the message completes. An answer recalled from the answer
// store on a redelivery counts exactly as a fresh one: a chunk of two items
// whose answers fit the bound only one at a time gets one answer and one
// too_large item error, whether both are asked or one was answered before.
// Before, the recalled answer did not count, and the chunk's result held
// both, past the bound.
func TestRecalledAnswersCountAgainstTheResultLimit(t *testing.T) {
	w := job.Work{V: job.Version, JobID: "job", Chunks: 1, Endpoint: job.EndpointChatCompletions}
	for _, id := range []string{"i0", "i1"} {
		w.Items = append(w.Items, job.Item{ID: id, Body: json.RawMessage(
			`{"model":"fake-model","messages":[{"role":"user","content":"the same [[len=40]]"}],"max_tokens":48}`)})
	}
	for _, recalled := range []bool{false, true} {
		synctest.Test(t, func(t *testing.T) {
			fake := fakeoai.NewUnstarted(fakeoai.Config{})
			defer fake.Close()
			open := func(cfg modelserver.Config) *modelserver.Model {
				cfg.BaseURL, cfg.HTTPClient, cfg.Models = fake.URL(), fake.Client(), []string{"fake-model"}
				cfg.Logger = slog.New(slog.DiscardHandler)
				m, err := modelserver.Open(t.Context(), cfg)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = m.Close() })
				return m
			}
			// One answer, as the server gives it to either item.
			probe, err := open(modelserver.Config{}).Run(t.Context(), w.Endpoint, w.Items[:1])
			if err != nil || probe[0].Response == nil {
				t.Fatalf("probe: %v, %+v", err, probe)
			}
			one := gpu.AnswerBytes(probe[0])
			m := open(modelserver.Config{ResultBytes: one + one/2})
			bucket := newMemPayloads()
			attrs := job.Attributes(w.Key())
			if recalled {
				// Item i0 was answered before the message was handed back.
				body, _ := json.Marshal(probe[0])
				bucket.objs[job.AnswerKey(job.AnswersPrefix("", w.JobID, w.Chunk), "i0")] = body
				attrs[AttrHandedBack] = "1"
			}
			h := startWith(t, 64*mib, Config{}, func(h *harness, c *Config) {
				c.Backend, c.Device, c.Payloads = m, nil, bucket
			})
			b, _ := json.Marshal(w)
			h.work.Put(string(b), attrs)
			wait.For(t, time.Minute, "the result", func() bool { r, _ := h.results.Stats(); return r == 1 })
			h.shutdown()
			got, _ := h.resultsByKey()
			r := got[w.Key()]
			if len(r.Outputs) != 2 {
				t.Fatalf("recalled %v: result outputs %+v; want 2", recalled, r.Outputs)
			}
			answered, tooLarge := 0, 0
			for _, o := range r.Outputs {
				switch {
				case o.Response != nil:
					answered++
				case o.Error != nil && o.Error.Code == job.ItemTooLarge:
					tooLarge++
				}
			}
			if answered != 1 || tooLarge != 1 {
				t.Errorf("recalled %v: %d answered, %d too_large; want 1 and 1 (%d bytes an answer, %d the bound)",
					recalled, answered, tooLarge, one, one+one/2)
			}
			if recalled && r.Outputs[0].Response == nil {
				t.Errorf("the recalled answer of i0 is not in the result: %+v", r.Outputs[0])
			}
		})
	}
}
