package subscriber_test

import (
	"fmt"
	"math"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vramq/vramq/gpu"
	"github.com/vramq/vramq/internal/testenv/jobq"
	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/model/bert"
	"github.com/vramq/vramq/model/wordpiece"
	"github.com/vramq/vramq/subscriber"
)

// TestE2EBERTModelDirectory serves a generated BERT model directory (the
// real tokenizer, random weights) through the whole subscriber on the
// queue endpoint: every text's vector in the results is what model/bert's
// Embed gives for the text's tokens alone, the results carry the model's
// name, and a message with a binary item is dead-lettered as invalid input
// with a reason that says so.
func TestE2EBERTModelDirectory(t *testing.T) {
	t.Parallel() // mostly waiting on real time: queues, visibility, processes
	dir := filepath.Join(t.TempDir(), "e2e-bert")
	g := bert.Generated{Config: bert.Config{VocabSize: 30522, HiddenSize: 32, NumLayers: 2, NumHeads: 4,
		IntermediateSize: 128, MaxPositionEmbeddings: 128, TypeVocabSize: 2, LayerNormEps: 1e-12}, MaxSeqLength: 64, Seed: 5}
	if err := bert.Generate(dir, "../model/wordpiece/testdata/tokenizer", g); err != nil {
		t.Fatal(err)
	}
	p := newPipelineWith(t, 5, subscriber.Config{MaxBatch: 4}, nil, func(dev *gpu.Sim) gpu.Model {
		e, err := bert.Open(dir, dev)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = e.Close() })
		return e
	})

	// Texts of many lengths, some past max_seq_length, in messages that
	// the subscriber batches together.
	words := strings.Fields("vramq admits work by memory; déjà vu, naïve café 東京 🙂 antidisestablishmentarianism the queue")
	var works []job.Work
	texts := map[string]string{}
	for c := range 6 {
		w := job.Work{V: job.Version, JobID: "bert-e2e", Chunk: c, Chunks: 7}
		for i := range 5 {
			var b strings.Builder
			for k := range (c*5+i)*(c*5+i)/6 + 1 {
				fmt.Fprintf(&b, "%s ", words[(c+i+k)%len(words)])
			}
			it := job.Item{ID: fmt.Sprintf("%d-%d", c, i), Text: b.String()}
			texts[it.ID] = it.Text
			w.Items = append(w.Items, it)
		}
		works = append(works, w)
	}
	works = append(works, job.Work{V: job.Version, JobID: "bert-e2e", Chunk: 6, Chunks: 7,
		Items: []job.Item{{ID: "png", Data: []byte("\x89PNG")}}})
	p.send(works)
	c := p.collect(6, 2*time.Minute)
	var dead []jobq.DeadLetter
	for deadline := time.Now().Add(30 * time.Second); len(dead) < 1 && time.Now().Before(deadline); {
		dead = append(dead, p.deadLetters()...)
	}
	p.shutdown()

	m, err := bert.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := wordpiece.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	truncated, checked := 0, 0
	for k, r := range c.Results {
		if r.Model != "bert:e2e-bert" {
			t.Errorf("chunk %d: model %q, want bert:e2e-bert", k.Chunk, r.Model)
		}
		for _, o := range r.Outputs {
			ids := tok.Encode(texts[o.ID], m.MaxSeqLength())
			if len(ids) == m.MaxSeqLength() {
				truncated++
			}
			want, err := m.Embed([][]int32{ids})
			if err != nil {
				t.Fatal(err)
			}
			// Padding in a batch moves no vector at all (see model/bert's
			// TestPaddingChangesNothing), and JSON carries float32 exactly.
			worst := 0.0
			for j := range want[0] {
				worst = max(worst, math.Abs(float64(want[0][j]-o.Embedding[j])))
			}
			if len(o.Embedding) != len(want[0]) || worst > 2e-6 {
				t.Errorf("item %s (%d tokens): %d dims, %.3g from Embed", o.ID, len(ids), len(o.Embedding), worst)
			}
			checked++
		}
	}
	if checked != 30 || truncated == 0 {
		t.Errorf("checked %d outputs (want 30), %d of them cut at max_seq_length (want some)", checked, truncated)
	}
	if len(dead) != 1 || !strings.HasPrefix(dead[0].Reason, "invalid_input") || !strings.Contains(dead[0].Reason, "binary data") {
		t.Errorf("dead letters %+v; want the binary item's message as invalid_input, saying binary data", dead)
	}
}
