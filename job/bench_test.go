package job_test

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/vramq/vramq/internal/testenv/workload"
	"github.com/vramq/vramq/job"
)

// benchBodies returns the JSON of one small (8 items of 24 words) and one
// large (32 items of 600 words) work message of the default mixed workload.
func benchBodies(b *testing.B) []struct {
	name  string
	body  []byte
	items int
} {
	b.Helper()
	works := workload.Mixed("0123456789abcdef0123456789abcdef", 2).Works() // chunk 0 is large, 1 small
	var out []struct {
		name  string
		body  []byte
		items int
	}
	for _, c := range []struct {
		name string
		w    job.Work
	}{{"small", works[1]}, {"large", works[0]}} {
		body, err := json.Marshal(c.w)
		if err != nil {
			b.Fatal(err)
		}
		out = append(out, struct {
			name  string
			body  []byte
			items int
		}{fmt.Sprintf("%s-%ditems", c.name, len(c.w.Items)), body, len(c.w.Items)})
	}
	return out
}

// BenchmarkDecodeWork is the subscriber's decode of every message it
// receives: strict JSON (unknown fields refused, trailing data refused) and
// validation. BenchmarkUnmarshalWorkPlain is its baseline.
func BenchmarkDecodeWork(b *testing.B) {
	for _, c := range benchBodies(b) {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(c.body)))
			for b.Loop() {
				if _, err := job.DecodeWork(c.body); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*c.items), "ns/item")
		})
	}
}

// BenchmarkUnmarshalWorkPlain is the baseline of BenchmarkDecodeWork: a
// plain json.Unmarshal into job.Work, no strictness, no validation.
func BenchmarkUnmarshalWorkPlain(b *testing.B) {
	for _, c := range benchBodies(b) {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(c.body)))
			for b.Loop() {
				var w job.Work
				if err := json.Unmarshal(c.body, &w); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*c.items), "ns/item")
		})
	}
}

// benchEmbeddings returns n embeddings of 256 dimensions with values like a
// normalised pooled vector's.
func benchEmbeddings(n int) [][]float32 {
	r := rand.New(rand.NewPCG(1, 2))
	es := make([][]float32, n)
	for i := range es {
		es[i] = make([]float32, 256)
		for j := range es[i] {
			es[i][j] = (r.Float32()*2 - 1) / 16
		}
	}
	return es
}

func benchResult(es [][]float32) *job.Result {
	r := &job.Result{V: job.Version, JobID: "0123456789abcdef0123456789abcdef", Chunk: 7, Model: "embed-ref",
		Attempt: 1, WorkerMS: 42, Outputs: make([]job.Output, len(es))}
	for i, e := range es {
		r.Outputs[i] = job.Output{ID: fmt.Sprintf("7-%d", i), Embedding: e}
	}
	return r
}

// BenchmarkEncodeResult is the subscriber's encode of a result message
// (json.Marshal of job.Result, as finish.go does) with 256-dimension
// embeddings; BenchmarkMarshalEmbeddingsPlain is its baseline.
func BenchmarkEncodeResult(b *testing.B) {
	for _, n := range []int{8, 32} {
		r := benchResult(benchEmbeddings(n))
		b.Run(fmt.Sprintf("items=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			body, err := json.Marshal(r)
			if err != nil {
				b.Fatal(err)
			}
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				if _, err := json.Marshal(r); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/item")
		})
	}
}

// BenchmarkMarshalEmbeddingsPlain is the baseline of BenchmarkEncodeResult:
// json.Marshal of the bare [][]float32, the float formatting no envelope can
// avoid. SetBytes is the Result's size so MB/s compare.
func BenchmarkMarshalEmbeddingsPlain(b *testing.B) {
	for _, n := range []int{8, 32} {
		es := benchEmbeddings(n)
		b.Run(fmt.Sprintf("items=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			body, err := json.Marshal(benchResult(es))
			if err != nil {
				b.Fatal(err)
			}
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				if _, err := json.Marshal(es); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/item")
		})
	}
}
