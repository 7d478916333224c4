package publisher_test

import (
	"fmt"
	"net/http"
	"testing"

	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/publisher"
	"github.com/vramq/vramq/publisher/publishertest"
)

// A Message Batch's completion event finalizes it under Lambda, as an
// OpenAI batch's does: the subscriber names the batch in the event
// (job.BatchOf, as subscriber/events.go writes batch_id), and the
// publisher's function, given the event, ends the batch.
func TestMessageBatchCompletionEventFinalizes(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true)
	s := e.serveUnswept(publisher.Config{Jobs: publisher.Jobs{ChunkItems: 1}})
	a := anthropicClient{s, ""}
	body := []byte(`{"requests":[{"custom_id":"e-0","params":` + question(0) + `},{"custom_id":"e-1","params":` + question(1) + `}]}`)
	r := a.do(http.MethodPost, "/v1/messages/batches", body)
	var b msgBatch
	r.json(t, &b)
	if r.status != http.StatusOK {
		t.Fatalf("create: %d %s", r.status, r.body)
	}
	publishertest.PutResults(t, e.store, b.ID, 0, 2)
	fn := publisher.LambdaEvents(s.pub.Handler(), s.pub)
	ev := snsEvent(fmt.Sprintf(`{"v":1,"event":"job.completed","job_id":%q,"batch_id":%q,"revision":1,"status":"completed"}`,
		b.ID, job.BatchOf(b.ID)))
	if _, err := fn(t.Context(), ev); err != nil {
		t.Fatal(err)
	}
	if got := a.batch(b.ID); got.ProcessingStatus != "ended" || got.RequestCounts.Succeeded != 2 {
		t.Errorf("after its completion event the batch is %+v; want ended, 2 succeeded", got)
	}
}
