package publisher_test

import (
	"strconv"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/vramq/vramq/gpu"
	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/model/backend"
	"github.com/vramq/vramq/model/refembed"
	"github.com/vramq/vramq/publisher"
	"github.com/vramq/vramq/publisher/jobs"
	"github.com/vramq/vramq/publisher/publishertest"
)

// runSubscriber runs a real subscriber (the reference model on a simulated
// device) on the env's queues and bucket until the test ends.
func (e *env) runSubscriber() { e.runSubscriberWith(nil) }

// runSubscriberWith is runSubscriber with the model wrapped by wrap, when
// not nil.
func (e *env) runSubscriberWith(wrap func(gpu.Model) gpu.Model) {
	e.t.Helper()
	model, dev := publishertest.RefModel(e.t)
	if wrap != nil {
		model = wrap(model)
	}
	e.runModel(backend.InProcess{Model: model}, dev)
}

// runModel runs a real subscriber of b on dev, on the env's queues and
// bucket, until the test ends.
func (e *env) runModel(b backend.Backend, dev gpu.Device) {
	e.t.Helper()
	publishertest.RunSubscriber(e.t, e.client, e.urls, e.store, b, dev, testLogger())
}

// waitSettled polls GET /v1/jobs/{id} until the job is no longer running.
func (s *server) waitSettled(t *testing.T, jobID string, limit time.Duration) jobStatus {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		st := s.status(t, jobID, "?page_size=1")
		if st.Status != jobs.StatusRunning {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("job %s still running after %v: %d of %d chunks done", jobID, limit, st.ChunksDone, st.Chunks)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// allOutputs pages through a settled job's results.
func (s *server) allOutputs(t *testing.T, jobID string, pageSize int) (map[string]job.Output, int) {
	t.Helper()
	out := map[string]job.Output{}
	pages := 0
	for token := ""; ; pages++ {
		q := "?page_size=" + strconv.Itoa(pageSize)
		if token != "" {
			q += "&page_token=" + token
		}
		st := s.status(t, jobID, q)
		for _, r := range st.Results {
			for _, o := range r.Outputs {
				if _, dup := out[o.ID]; dup {
					t.Errorf("item %q in two results", o.ID)
				}
				out[o.ID] = o
			}
		}
		if token = st.NextPageToken; token == "" {
			return out, pages + 1
		}
	}
}

// TestPipeline: jobs go through the publisher, a real subscriber on the same
// queues and bucket, and come back through GET /v1/jobs/{id}: every item of a
// 200-item job has its result, paged; an item claim-checked through S3 (its
// hash verified by the subscriber) gives the same output as the same text
// sent inline.
func TestPipeline(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true)
	inline := e.serve(publisher.Config{Jobs: publisher.Jobs{MaxMessageBytes: 64 << 10}})
	claiming := e.serve(publisher.Config{Jobs: publisher.Jobs{MaxMessageBytes: 64 << 10, MaxItemBytes: 1 << 10}})
	e.runSubscriber()

	twin := words(12345, 500) // about 3 KiB: inline on one publisher, claim-checked on the other
	items := manyItems("doc-", 200, 20)
	items[150] = jobs.RequestItem{ID: "twin", Text: twin}
	a := inline.mustPost(jobBody(t, items, 16), nil)
	b := claiming.mustPost(jobBody(t, []jobs.RequestItem{{ID: "big", Text: twin}, {ID: "small", Text: "hello"}}, 0), nil)
	if a.Chunks != 13 || a.ClaimChecked != 0 || b.ClaimChecked != 1 {
		t.Fatalf("jobs: %+v and %+v", a, b)
	}

	for _, j := range []accepted{a, b} {
		st := inline.waitSettled(t, j.JobID, time.Minute)
		if st.Status != jobs.StatusComplete || st.ChunksDone != j.Chunks || st.ItemsDone != j.Items || len(st.Failed) != 0 {
			t.Errorf("job %s settled as %+v", j.JobID, st)
		}
	}
	outs, pages := inline.allOutputs(t, a.JobID, 5)
	if pages != 3 {
		t.Errorf("%d pages of 5 chunks for 13 chunks, want 3", pages)
	}
	if len(outs) != 200 {
		t.Errorf("%d results, want 200", len(outs))
	}
	for _, it := range items {
		if o, ok := outs[it.ID]; !ok || len(o.Embedding) != refembed.DefaultConfig().Out {
			t.Errorf("item %q: result %v", it.ID, ok)
		}
	}
	bouts, _ := claiming.allOutputs(t, b.JobID, 10)
	if diff := cmp.Diff(outs["twin"].Embedding, bouts["big"].Embedding); diff != "" || len(bouts["big"].Embedding) == 0 {
		t.Errorf("claim-checked item's output differs from the inline one (-inline +claimed):\n%s", diff)
	}
}
