package subscriber

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/vramq/vramq/gpu"
	"github.com/vramq/vramq/internal/testenv/wait"
	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/job/fault"
	"github.com/vramq/vramq/subscriber/queue"
)

// The tests of this file send what a hostile sender to the work queue can
// send (issue 14, items 2 to 10). Each waits for every message to have
// ended, since the defects they catch made messages loop until redrive.

// putRaw puts body on the work queue with attrs.
func (h *harness) putRaw(body string, attrs map[string]string) {
	h.work.Put(body, attrs)
}

// endedAll waits until results and dead letters add up to n, and the work
// queue is empty.
func (h *harness) endedAll(n int) {
	h.t.Helper()
	wait.For(h.t, 5*time.Minute, fmt.Sprintf("%d messages ended", n), func() bool {
		r, _ := h.results.Stats()
		d, _ := h.dlq.Stats()
		w, _ := h.work.Stats()
		return r+d == n && w == 0
	})
}

// reasonsByBody maps each dead letter's body (cut to 40 bytes) to its reason.
func (h *harness) reasons() map[string]string {
	out := map[string]string{}
	for _, m := range h.dlq.All() {
		k, _ := chunkOf(queue.Message{Body: m.Body})
		out[k.JobID+"/"+strconv.Itoa(k.Chunk)] = m.Attributes[job.AttrReason]
	}
	return out
}

func workBody(t *testing.T, w job.Work) string {
	t.Helper()
	w.V = job.Version
	b, err := json.Marshal(w)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// Item 2: ids outside the grammar are dead-lettered; a failed marker is
// written only for a body that decoded as work (issue 25, item 5), never
// from the attributes; a marker is never replaced.
func TestIdentityFromBodyAndMarkersKept(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newMemPayloads()
		h := start(t, 64*mib, Config{Payloads: p})
		victimMarker := []byte(`{"v":1,"job_id":"victim","chunk":0,"reason":"out_of_memory: real","message_id":"m0","at":"2026-01-01T00:00:00Z"}`)
		if _, err := p.Put(t.Context(), job.FailedKey("victim", 0), victimMarker); err != nil {
			t.Fatal(err)
		}
		// Malformed (no items), naming the victim's failed chunk in its body.
		h.putRaw(`{"v":1,"job_id":"victim","chunk":0,"items":[]}`, job.Attributes(job.Key{JobID: "victim", Chunk: 0}))
		// Malformed, its attributes naming the victim's chunk 1, its body another job.
		h.putRaw(`{"v":1,"job_id":"attacker","chunk":5,"items":[]}`, job.Attributes(job.Key{JobID: "victim", Chunk: 1}))
		// Ids outside the grammar.
		h.putRaw(workBody(t, job.Work{JobID: "../victim", Items: []job.Item{{ID: "a", Text: "mb=1"}}}), nil)
		h.putRaw(workBody(t, job.Work{JobID: strings.Repeat("j", 5000), Items: []job.Item{{ID: "a", Text: "mb=1"}}}), nil)
		h.putRaw(workBody(t, job.Work{JobID: "ctl", Items: []job.Item{{ID: "a\x01", Text: "mb=1"}}}), nil)
		h.putRaw(workBody(t, job.Work{JobID: "longitem", Items: []job.Item{{ID: strings.Repeat("i", 257), Text: "mb=1"}}}), nil)
		h.endedAll(6)
		h.shutdown()

		if b, _ := p.object(job.FailedKey("victim", 0)); string(b) != string(victimMarker) {
			t.Errorf("the victim's marker was replaced with %s", b)
		}
		if _, ok := p.object(job.FailedKey("victim", 1)); ok {
			t.Error("a marker was written for the chunk the attributes named")
		}
		// Issue 25, item 5: none of these decoded as work, so none marks
		// a chunk, not even the one its body names.
		for key := range p.objs {
			if strings.HasPrefix(key, "failed/") && key != job.FailedKey("victim", 0) {
				t.Errorf("marker at %q", key)
			}
		}
		var malformed int
		for _, m := range h.dlq.All() {
			r := m.Attributes[job.AttrReason]
			if strings.HasPrefix(r, "malformed: ") {
				malformed++
			}
			if len(r) > maxReasonLen {
				t.Errorf("reason of %d bytes", len(r))
			}
		}
		if malformed != 6 {
			t.Errorf("%d dead letters malformed, want 6: %q", malformed, h.reasons())
		}
	})
}

// Items 3 and 5: an item id that SQS cannot carry raw gets its result all
// the same (escaped), and a result SQS refuses for good is dead-lettered
// with a reason, not retried until redrive; its neighbours go out.
func TestResultsSQSCannotTake(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := start(t, 64*mib, Config{})
		h.results.SendErr = func(body string) error {
			if strings.Contains(body, "refuse-me") {
				return &queue.Error{Kind: queue.ErrRefused, Code: "InvalidMessageContents"}
			}
			return nil
		}
		odd := "emoji 😀 \uFFFE\uFFFF"
		h.putRaw(workBody(t, job.Work{JobID: "odd", Items: []job.Item{{ID: odd, Text: "mb=1"}}}), nil)
		h.putRaw(workBody(t, job.Work{JobID: "refused", Items: []job.Item{{ID: "refuse-me", Text: "mb=1"}}}), nil)
		for c := range 3 {
			h.putRaw(workBody(t, job.Work{JobID: "fine", Chunk: c, Items: []job.Item{{ID: "a", Text: "mb=1"}}}), nil)
		}
		h.endedAll(5)
		h.shutdown()
		got, _ := h.resultsByKey()
		if r := got[job.Key{JobID: "odd"}]; len(r.Outputs) != 1 || r.Outputs[0].ID != odd {
			t.Errorf("result of the odd id: %+v", r)
		}
		if len(got) != 4 {
			t.Errorf("%d results, want 4", len(got))
		}
		if r := h.reasons()["refused/0"]; r != "result_refused: the results queue refuses the result: InvalidMessageContents" {
			t.Errorf("reason %q", r)
		}
	})
}

// Item 5: a message whose job id alone is larger than a shared result call
// is refused at once (the grammar), and its neighbours' results are sent,
// on a results queue that refuses calls over the limit as SQS does.
func TestLongJobIDDoesNotPoisonSharedCalls(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := startWith(t, 64*mib, Config{MaxBatchDelay: 50 * time.Millisecond}, func(h *harness, c *Config) {
			h.results.MaxBytes = c.MaxMessageBytes
			h.dlq.MaxBytes = c.MaxMessageBytes
			if h.results.MaxBytes == 0 {
				h.results.MaxBytes, h.dlq.MaxBytes = 256<<10, 256<<10
			}
		})
		long := strings.Repeat("j", 130<<10)
		h.putRaw(workBody(t, job.Work{JobID: long, Items: []job.Item{{ID: "a", Text: "mb=1"}}}), job.Attributes(job.Key{JobID: long}))
		for c := range 9 {
			h.putRaw(workBody(t, job.Work{JobID: "n", Chunk: c, Items: []job.Item{{ID: "a", Text: "mb=1"}}}), nil)
		}
		h.endedAll(10)
		h.shutdown()
		if got, _ := h.resultsByKey(); len(got) != 9 {
			t.Errorf("%d results, want the 9 neighbours'", len(got))
		}
		d := h.dlq.All()
		if len(d) != 1 || !strings.HasPrefix(d[0].Attributes[job.AttrReason], "malformed: malformed message: job_id: id too long") {
			t.Errorf("dead letters %d, reason %q", len(d), d[0].Attributes[job.AttrReason])
		}
	})
}

// Item 6: a dead letter whose body, attributes and reason do not fit in one
// message still carries its reason; the body is cut, and says so.
func TestDeadLetterThatDoesNotFitKeepsItsReason(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const limit = 4 << 10
		h := startWith(t, 64*mib, Config{MaxMessageBytes: limit}, func(h *harness, c *Config) { h.dlq.MaxBytes = limit })
		body := `{"v":1,"job_id":"big","chunk":0,"items":[],"pad":"` + strings.Repeat("é", limit/2) + `"}`
		attrs := map[string]string{"a-original": strings.Repeat("x", 1000)}
		h.putRaw(body, attrs)
		h.endedAll(1)
		h.shutdown()
		d := h.dlq.All()[0]
		if r := d.Attributes[job.AttrReason]; !strings.HasPrefix(r, "malformed: ") {
			t.Errorf("reason %q", r)
		}
		if d.Attributes[AttrBodyTruncated] != strconv.Itoa(len(body)) || !strings.HasPrefix(body, d.Body) || len(d.Body) < limit/2 {
			t.Errorf("copy of %d bytes, truncated attribute %q; want the start of the %d-byte body",
				len(d.Body), d.Attributes[AttrBodyTruncated], len(body))
		}
		if n := job.MessageSize(d.Body, d.Attributes); n > limit {
			t.Errorf("copy of %d bytes", n)
		}
	})
}

// Items 4 and 7: results that can never be stored or sent are dead-lettered
// with a reason: one that does not encode (and no empty object is stored),
// one over MaxResultBytes, one that S3 refuses for good; a message of more
// than job.MaxItems items is refused at once.
func TestResultsThatCanNeverBeStored(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newMemPayloads()
		p.putErr = func(key string) error {
			if key == job.ResultKey("s3refuses", 0) {
				return &queue.Error{Kind: queue.ErrRefused, Code: "EntityTooLarge"}
			}
			return nil
		}
		h := start(t, 64*mib, Config{Payloads: p, MaxResultBytes: 4096})
		h.putRaw(workBody(t, job.Work{JobID: "nan", Items: []job.Item{{ID: "ok", Text: "mb=1"}, {ID: "bad", Text: "mb=1 nan"}}}), nil)
		h.putRaw(workBody(t, job.Work{JobID: "huge", Items: []job.Item{{ID: "a", Text: "mb=1 out=2000"}}}), nil)
		h.putRaw(workBody(t, job.Work{JobID: "s3refuses", Items: []job.Item{{ID: "a", Text: "mb=1"}}}), nil)
		many := job.Work{JobID: "many"}
		for i := range job.MaxItems + 1 {
			many.Items = append(many.Items, job.Item{ID: strconv.Itoa(i), Text: "x"})
		}
		h.putRaw(workBody(t, many), nil)
		h.putRaw(workBody(t, job.Work{JobID: "fine", Items: []job.Item{{ID: "a", Text: "mb=1"}}}), nil)
		h.endedAll(5)
		h.shutdown()
		reasons := h.reasons()
		for key, want := range map[string]string{
			"nan/0":       `invalid_output: the output of item "bad" cannot be encoded: json: unsupported value: NaN`,
			"huge/0":      "result_too_large: result of ",
			"s3refuses/0": "result_refused: the payload bucket refuses the result: EntityTooLarge",
			"many/0":      "malformed: malformed message: 1001 items; at most 1000 in one message",
		} {
			if !strings.HasPrefix(reasons[key], want) {
				t.Errorf("%s: reason %q, want %q", key, reasons[key], want)
			}
		}
		for _, k := range []string{"nan", "huge", "many"} {
			if b, ok := p.object(job.ResultKey(k, 0)); ok {
				t.Errorf("results/%s/0.json stored (%d bytes) for a chunk that has no result", k, len(b))
			}
		}
		if _, ok := p.object(job.ResultKey("fine", 0)); !ok {
			t.Error("the fine chunk's result was not stored")
		}
	})
}

// Item 8: a model that panics in Run or Cost does not end the process: the
// batch is split until the message that panics is alone, and it is
// dead-lettered as invalid input; its batch-mates get their results.
func TestModelPanicsAreInvalidInput(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := start(t, 64*mib, Config{MaxBatchDelay: 100 * time.Millisecond, MaxInflight: 8})
		for c := range 4 {
			h.send("mates", c, "mb=1")
		}
		h.send("panics", 0, "mb=1 panic", "mb=1 panic") // all items: one alone is an item error (itemerrors_test.go)
		h.send("costs", 0, "mb=1 costpanic")
		h.endedAll(6)
		h.shutdown()
		reasons := h.reasons()
		for key, want := range map[string]string{
			"panics/0": "invalid_input: invalid input: model test-model panicked in Run: runtime error: index out of range [2] with length 0",
			"costs/0":  "invalid_input: invalid input: model test-model panicked in Cost: test model: cost of i0",
		} {
			if reasons[key] != want {
				t.Errorf("%s: reason %q, want %q", key, reasons[key], want)
			}
		}
		if got, _ := h.resultsByKey(); len(got) != 4 {
			t.Errorf("%d results, want the 4 batch-mates'", len(got))
		}
	})
}

type panickyLauncher struct{ *testModel }

func (*panickyLauncher) Launch(context.Context, []job.Item) (gpu.Launched, error) {
	panic("launch")
}

type panickyLaunched struct{}

func (panickyLaunched) Run(context.Context) ([]job.Output, error) { panic("launched run") }

// Item 8, the two-phase calls: Launch and the launched Run recover too.
func TestLaunchPanicsAreInvalidInput(t *testing.T) {
	m := &panickyLauncher{&testModel{}}
	s := &Subscriber{cfg: Config{Model: m}, admitting: admitting{launcher: m}, log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	_, err := s.modelLaunch(t.Context(), nil)
	if !errors.Is(err, fault.ErrInvalidInput) || !strings.Contains(err.Error(), "panicked in Launch: launch") {
		t.Errorf("Launch: %v", err)
	}
	_, err = s.launchedRun(t.Context(), panickyLaunched{})
	if !errors.Is(err, fault.ErrInvalidInput) || !strings.Contains(err.Error(), "panicked in Launched.Run") {
		t.Errorf("Launched.Run: %v", err)
	}
}

// Item 10: the subscriber refuses an item with neither text nor data, by
// the rule the publisher applies, inline or claim-checked.
func TestItemsWithoutContentRefused(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newMemPayloads()
		h := start(t, 64*mib, Config{Payloads: p})
		h.putRaw(`{"v":1,"job_id":"empty","chunk":0,"items":[{"id":"a"}]}`, nil)
		h.putRaw(`{"v":1,"job_id":"emptydata","chunk":0,"items":[{"id":"a","text":"","data":""}]}`, nil)
		h.sendWork(job.Work{JobID: "emptyref", Items: []job.Item{claimChecked(t, p, job.ItemKey("emptyref", "a"), job.Item{ID: "a"})}})
		h.endedAll(3)
		h.shutdown()
		reasons := h.reasons()
		for key, want := range map[string]string{
			"empty/0":     `malformed: item 0: malformed message: item "a": item has neither text nor data`,
			"emptydata/0": `malformed: item 0: malformed message: item "a": item has neither text nor data`,
			"emptyref/0":  `claim_check: item "a": no object in the payload bucket matches the reference`,
		} {
			if reasons[key] != want {
				t.Errorf("%s: reason %q, want %q", key, reasons[key], want)
			}
		}
	})
}
