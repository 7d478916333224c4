package backend

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vramq/vramq/gpu"
	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/model/bert"
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
	b := InProcess{Model: m}
	items := []job.Item{
		{ID: "a", Body: json.RawMessage(`{"model":"x","input":"one two three"}`)},
		{ID: "b", Body: json.RawMessage(`{"model":"x","input":["four five","six"]}`)},
		{ID: "c", Body: json.RawMessage(`{"model":"x","input":[[1,2]]}`)},
	}
	texts := []job.Item{{ID: "a", Text: "one two three"}, {ID: "b", Text: "four five"}, {ID: "b", Text: "six"}}
	got := b.Cost(job.EndpointEmbeddings, items)
	if want := m.Cost(texts); got != want || want == 0 {
		t.Errorf("cost %d; want %d, the cost of the inputs as texts", got, want)
	}
	if got := b.Cost(job.EndpointEmbeddings, items[2:]); got != 0 {
		t.Errorf("token-id item: cost %d; want 0", got)
	}
	if got := b.Cost(job.EndpointChatCompletions, items[:1]); got != 0 {
		t.Errorf("chat item: cost %d; want 0 (it never runs here)", got)
	}
}

// BERT's usage counts the tokens it runs, [CLS] and [SEP] included, as TEI
// does; dimensions other than the model's size are the item's error.
func TestEmbeddingsUsageCountsBERTTokens(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "embed-bert")
	g := bert.Generated{Config: bert.Config{VocabSize: 30522, HiddenSize: 32, NumLayers: 2, NumHeads: 4,
		IntermediateSize: 128, MaxPositionEmbeddings: 64, TypeVocabSize: 2, LayerNormEps: 1e-12}, MaxSeqLength: 64, Seed: 3}
	if err := bert.Generate(dir, "../wordpiece/testdata/tokenizer", g); err != nil {
		t.Fatal(err)
	}
	e, err := bert.Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close() })
	items := []job.Item{
		{ID: "a", Body: json.RawMessage(`{"model":"x","input":["hello world","the cat sat on the mat"]}`)},
		{ID: "d", Body: json.RawMessage(`{"model":"x","input":"hello","dimensions":7}`)},
	}
	outs, err := runEmbeddings(t.Context(), e, items)
	if err != nil {
		t.Fatal(err)
	}
	var body struct {
		Usage struct {
			PromptTokens int `json:"prompt_tokens"`
		} `json:"usage"`
	}
	if outs[0].Response == nil || json.Unmarshal(outs[0].Response.Body, &body) != nil {
		t.Fatalf("item a: %+v; want a response", outs[0])
	}
	// WordPiece of these lowercase words is one token a word.
	if want := 2 + 2 + 6 + 2; body.Usage.PromptTokens != want {
		t.Errorf("prompt_tokens %d; want %d, [CLS] and [SEP] counted", body.Usage.PromptTokens, want)
	}
	if o := outs[1]; o.Error == nil || o.Error.Code != job.ItemInvalidInput || !strings.Contains(o.Error.Message, "dimensions 7") {
		t.Errorf("item d: %+v; want an invalid_input error for dimensions", o)
	}
}
