package publisher_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/vramq/vramq/gpu"
	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/job/fault"
	"github.com/vramq/vramq/publisher"
	"github.com/vramq/vramq/publisher/jobs"
)

// refusingModel refuses, as invalid input, every batch holding an item
// whose text starts with "REFUSE", as a text model refuses binary data.
type refusingModel struct{ gpu.Model }

func (m refusingModel) Run(ctx context.Context, items []job.Item) ([]job.Output, error) {
	for _, it := range items {
		if strings.HasPrefix(it.Text, "REFUSE") {
			return nil, fmt.Errorf("item %s is not text \x01: %w", it.ID, fault.ErrInvalidInput)
		}
	}
	return m.Model.Run(ctx, items)
}

// Issue 20, item 3, end to end on the emulator: a job whose chunk holds one
// item the model refuses completes; GET /v1/jobs/{id} counts that item
// failed, answers it with an error and every other item with its output;
// a chunk whose items are all refused is the job's one failed chunk.
func TestPipelineItemErrors(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true)
	s := e.serve(publisher.Config{})
	e.runSubscriberWith(func(inner gpu.Model) gpu.Model { return refusingModel{inner} })

	items := manyItems("doc-", 8, 20)
	items[2].Text = "REFUSE this one"
	a := s.mustPost(jobBody(t, items, 4), nil)
	st := s.waitSettled(t, a.JobID, time.Minute)
	if st.Status != jobs.StatusComplete || st.ChunksDone != 2 || st.ItemsDone != 7 || st.ItemsFailed != 1 {
		t.Errorf("job settled as %+v; want complete, 7 items done, 1 failed", st)
	}
	outs, _ := s.allOutputs(t, a.JobID, 10)
	for _, it := range items {
		o := outs[it.ID]
		if it.ID == items[2].ID {
			if o.Error == nil || o.Error.Code != job.ItemInvalidInput || o.Embedding != nil ||
				o.Error.Message != `item doc-002 is not text \x01: invalid input` {
				t.Errorf("refused item: %+v (error %+v)", o, o.Error)
			}
			continue
		}
		if o.Error != nil || len(o.Embedding) == 0 {
			t.Errorf("item %s: %+v (error %+v), want an embedding", it.ID, o, o.Error)
		}
	}

	bad := manyItems("bad-", 4, 20)
	for i := range bad[:2] {
		bad[i].Text = "REFUSE"
	}
	b := s.mustPost(jobBody(t, bad, 2), nil)
	st = s.waitSettled(t, b.JobID, time.Minute)
	if st.Status != jobs.StatusPartial || st.ChunksFailed != 1 || len(st.Failed) != 1 || st.Failed[0].Chunk != 0 ||
		!strings.HasPrefix(st.Failed[0].Reason, "invalid_input: ") || st.ItemsDone != 2 || st.ItemsFailed != 0 {
		t.Errorf("all-refused chunk: job settled as %+v; want chunk 0 failed as invalid_input", st)
	}
}
