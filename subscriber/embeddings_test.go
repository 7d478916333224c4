package subscriber

import (
	"encoding/json"
	"testing"

	"github.com/vramq/vramq/gpu"
	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/model/refembed"
)

// An in-process model's embeddings items cost what their inputs cost as
// text items, so that admission holds the memory their batch will use; an
// item that cannot run costs nothing.
func TestEmbeddingsItemsCostTheirInputs(t *testing.T) {
	cfg := refembed.DefaultConfig()
	m, err := refembed.NewEmbedder(refembed.GenerateWeights(cfg), cfg, gpu.NewSim(cfg.WeightBytes()+1<<30))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	s := &Subscriber{cfg: Config{Model: m}}
	items := []job.Item{
		{ID: "a", Body: json.RawMessage(`{"model":"x","input":"one two three"}`)},
		{ID: "b", Body: json.RawMessage(`{"model":"x","input":["four five","six"]}`)},
		{ID: "c", Body: json.RawMessage(`{"model":"x","input":[[1,2]]}`)},
	}
	texts := []job.Item{{ID: "a", Text: "one two three"}, {ID: "b", Text: "four five"}, {ID: "b", Text: "six"}}
	got, err := s.modelCost(job.EndpointEmbeddings, items)
	if want := m.Cost(texts); err != nil || got != want || want == 0 {
		t.Errorf("cost %d, %v; want %d, the cost of the inputs as texts", got, err, want)
	}
	if got, err := s.modelCost(job.EndpointEmbeddings, items[2:]); err != nil || got != 0 {
		t.Errorf("token-id item: cost %d, %v; want 0", got, err)
	}
	if got, err := s.modelCost(job.EndpointChatCompletions, items[:1]); err != nil || got != 0 {
		t.Errorf("chat item: cost %d, %v; want 0 (it never runs here)", got, err)
	}
}
