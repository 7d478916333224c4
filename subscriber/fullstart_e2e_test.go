package subscriber_test

import (
	"testing"
	"time"

	"github.com/vramq/vramq/gpu"
	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/model/refembed"
	"github.com/vramq/vramq/subscriber"
)

// A subscriber starts on a device that has no room for work now (another
// process holds it all: a shared GPU, or a model server busy with others'
// requests or a crashed predecessor's), with nothing admitted; once the
// memory comes back the budget refresh lets the work in. Before, New
// refused to start, and a restart met the same moment.
func TestE2EStartsOnAFullDevice(t *testing.T) {
	t.Parallel() // mostly waiting on real time: queues, visibility, processes
	if endpoint() == "" {
		t.Skip("no SQS endpoint: set AWS_ENDPOINT_URL (make test starts the emulator and sets it)")
	}
	var giveBack func()
	p := newPipelineWith(t, 3, subscriber.Config{BudgetRefresh: 100 * time.Millisecond}, nil, func(dev *gpu.Sim) gpu.Model {
		emb, err := refembed.NewEmbedder(refembed.GenerateWeights(refembed.DefaultConfig()), refembed.DefaultConfig(), dev)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = emb.Close() })
		mem, _ := dev.MemInfo()
		if giveBack, err = dev.Alloc(mem.Free); err != nil {
			t.Fatal(err)
		}
		return emb
	})
	works := []job.Work{
		{V: job.Version, JobID: "full", Chunk: 0, Chunks: 2, Items: []job.Item{{ID: "a", Text: "one"}}},
		{V: job.Version, JobID: "full", Chunk: 1, Chunks: 2, Items: []job.Item{{ID: "b", Text: "two"}}},
	}
	p.send(works)
	giveBack()
	c := p.collect(len(works), time.Minute)
	for k, r := range c.Results {
		if len(r.Outputs) != 1 || r.Outputs[0].Error != nil || len(r.Outputs[0].Embedding) == 0 {
			t.Errorf("%v: %+v; want an embedding", k, r.Outputs)
		}
	}
	if d := p.deadLetters(); len(d) != 0 {
		t.Errorf("%d dead letters: %+v", len(d), d)
	}
	p.shutdown()
}
