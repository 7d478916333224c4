package backend

import (
	"context"
	"testing"

	"github.com/vramq/vramq/job"
)

// countingModel is a gpu.Model that costs 10 a text item and answers each
// with its text's length, counting the items it ran.
type countingModel struct{ ran int }

func (*countingModel) Name() string                { return "counting" }
func (*countingModel) Weights() int64              { return 0 }
func (*countingModel) Cost(items []job.Item) int64 { return 10 * int64(len(items)) }
func (m *countingModel) Run(_ context.Context, items []job.Item) ([]job.Output, error) {
	m.ran += len(items)
	outs := make([]job.Output, len(items))
	for i, it := range items {
		outs[i] = job.Output{ID: it.ID, Embedding: []float32{float32(len(it.Text))}}
	}
	return outs, nil
}

// The in-process backend hands text jobs to its model unchanged, and
// answers the items of an endpoint its model cannot serve itself, at no
// cost, without running them; it offers nothing but the device's memory.
func TestInProcessRoutesByEndpoint(t *testing.T) {
	m := &countingModel{}
	b := InProcess{Model: m}
	texts := []job.Item{{ID: "a", Text: "one"}, {ID: "b", Text: "three"}}
	if got := b.Cost("", texts); got != 20 {
		t.Errorf("text cost %d; want the model's, 20", got)
	}
	outs, err := b.Run(t.Context(), "", texts)
	if err != nil || len(outs) != 2 || outs[1].Embedding[0] != 5 || m.ran != 2 {
		t.Fatalf("text run: %+v, %v, %d ran; want the model's outputs", outs, err, m.ran)
	}

	chat := []job.Item{{ID: "c", Body: []byte(`{"model":"x","messages":[{"role":"user","content":"hi"}]}`)}}
	if got := b.Cost(job.EndpointChatCompletions, chat); got != 0 {
		t.Errorf("chat cost %d; want 0: it never runs here", got)
	}
	outs, err = b.Run(t.Context(), job.EndpointChatCompletions, chat)
	if err != nil || len(outs) != 1 || outs[0].ID != "c" || outs[0].Error == nil || outs[0].Error.Code != job.ItemUnsupportedEndpoint {
		t.Errorf("chat run: %+v, %v; want one unsupported_endpoint item error", outs, err)
	}
	if m.ran != 2 {
		t.Errorf("the model ran %d items; want the 2 texts only", m.ran)
	}

	if now, most := b.Offers(); now != (Vector{}) || most != (Vector{}) {
		t.Errorf("offers %v, %v; want none", now, most)
	}
	if n := b.Needs("", texts); n != (Vector{}) {
		t.Errorf("needs %v; want none", n)
	}
}
