package refembed

import (
	"bytes"
	"encoding/binary"
	"math"
	"os"
	"runtime"
	"testing"

	"github.com/vramq/vramq/internal/testenv/floats"
	"github.com/vramq/vramq/model/safetensors"
)

// FuzzReadSafetensors feeds arbitrary bytes to the safetensors reader and
// every loader built on it (weights, token batch, embeddings). The seeds are
// a weights file of tinyConfig, one with F16 and BF16 tensors, a token
// batch, the Python-written embeddings file and a few files from the
// format's reference test suite. Invariants:
//   - nothing panics;
//   - reading allocates at most a fixed multiple of the input's size, so a
//     header claiming huge shapes or lengths costs nothing;
//   - a file the safetensors reader refuses, every loader refuses (the
//     reader's own invariants are model/safetensors's FuzzRead);
//   - accepted weights have a valid config that NewEmbedder takes, are
//     finite, run, and make the same file round trip bit for bit;
//   - accepted embeddings are rows of one width, each capped.
func FuzzReadSafetensors(f *testing.F) {
	cfg := tinyConfig()
	f.Add(weightsFile(f, cfg))
	var buf bytes.Buffer
	WriteTokenBatch(&buf, cfg, sampleItems())
	f.Add(buf.Bytes())
	buf = bytes.Buffer{}
	safetensors.Write(&buf, map[string]string{"format": WeightsFormat, "max_tokens": "3"}, []safetensors.Tensor{
		{Name: "embedding", Shape: []int64{2, 1}, DType: "F16", Raw: []byte{0, 0x3c, 0x01, 0x80}},
		{Name: "w1", Shape: []int64{1, 2}, DType: "BF16", Raw: []byte{0x80, 0x3f, 0x49, 0xc0}},
		{Name: "b1", Shape: []int64{2}, Values: []float32{0.5, -0.5}},
		{Name: "w2", Shape: []int64{2, 1}, Values: []float32{1, 2}},
		{Name: "b2", Shape: []int64{1}, Values: []float32{0.25}},
	})
	f.Add(buf.Bytes())
	if py, err := os.ReadFile("testdata/embeddings-python.safetensors"); err == nil {
		f.Add(py)
	}
	f.Add(rawSafetensors(`{"attn.0":{"dtype":"F32","shape":[1,2,3],"data_offsets":[0,24]}}`, le32(0, 1, 2, 3, 4, 5)))
	f.Add(rawSafetensors(`{"__metadata__":{"framework":"pt"},"test":{"dtype":"I32","shape":[2,0],"data_offsets":[0,0]}}`, nil))
	f.Add(rawSafetensors(`{"test":{"dtype":"I32","shape":[2,9223372036854775807],"data_offsets":[0,16]}}`, make([]byte, 16)))
	// A header length just under the limit, in a file of a few bytes.
	f.Add(append(binary.LittleEndian.AppendUint64(nil, safetensors.MaxHeader-1), "{}"...))

	f.Fuzz(func(t *testing.T, data []byte) {
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		file, err := safetensors.Open(bytes.NewReader(data), int64(len(data)))
		var raws [][]byte
		if err == nil {
			for _, name := range file.Names() {
				raw, err := file.Raw(name)
				if err != nil {
					t.Fatalf("accepted file, tensor %q unreadable: %v", name, err)
				}
				raws = append(raws, raw)
			}
		}
		w, wcfg, werr := ReadWeights(bytes.NewReader(data), int64(len(data)))
		batch, berr := ReadTokenBatch(bytes.NewReader(data), int64(len(data)))
		rows, eerr := ReadEmbeddings(bytes.NewReader(data), int64(len(data)))
		runtime.ReadMemStats(&after)
		// Four parses of the header and two copies of the data, with room
		// for encoding/json's working memory; a read sized by what a
		// header claims, not by what the file holds, would blow past it.
		if alloc, limit := after.TotalAlloc-before.TotalAlloc, uint64(64*len(data)+1<<20); alloc > limit {
			t.Fatalf("reading %d bytes allocated %d (limit %d)", len(data), alloc, limit)
		}

		if err != nil {
			if werr == nil || berr == nil || eerr == nil {
				t.Fatalf("safetensors.Open refused (%v) what a loader took", err)
			}
			return
		}
		_ = raws // read to bound the allocations, as the loaders do
		buf := new(bytes.Buffer)
		if werr == nil {
			if err := wcfg.Validate(); err != nil {
				t.Fatalf("accepted weights with an invalid config: %v", err)
			}
			e, err := NewEmbedder(w, wcfg, nil)
			if err != nil {
				t.Fatalf("accepted weights NewEmbedder refuses: %v", err)
			}
			if _, err := e.Run(t.Context(), texts("fuzz the weights", "")); err != nil {
				t.Fatalf("accepted weights do not run: %v", err)
			}
			buf.Reset()
			if err := WriteWeights(buf, wcfg, w); err != nil {
				t.Fatalf("write accepted weights: %v", err)
			}
			w2, cfg2, err := ReadWeights(bytes.NewReader(buf.Bytes()), int64(buf.Len()))
			if err != nil || cfg2 != wcfg || !floats.SameBits(w2.Embedding, w.Embedding) || !floats.SameBits(w2.W1, w.W1) ||
				!floats.SameBits(w2.B1, w.B1) || !floats.SameBits(w2.W2, w.W2) || !floats.SameBits(w2.B2, w.B2) {
				t.Fatalf("weights round trip: %v, config %+v, want %+v", err, cfg2, wcfg)
			}
		}
		if berr == nil && (batch.Items() < 0 || int(batch.Offsets[batch.Items()]) != len(batch.Tokens)) {
			t.Fatalf("accepted token batch with offsets %v for %d tokens", batch.Offsets, len(batch.Tokens))
		}
		if eerr == nil {
			for i, r := range rows {
				if len(r) != len(rows[0]) || cap(r) != len(r) {
					t.Fatalf("embeddings row %d: len %d cap %d, row 0 len %d", i, len(r), cap(r), len(rows[0]))
				}
			}
		}
	})
}

// rawSafetensors is a safetensors file of header (unpadded) and data,
// spelled out by hand, as the format's reference test vectors are.
func rawSafetensors(header string, data []byte) []byte {
	out := binary.LittleEndian.AppendUint64(nil, uint64(len(header)))
	out = append(out, header...)
	return append(out, data...)
}

// le32 is vs as F32 data.
func le32(vs ...float32) []byte {
	var out []byte
	for _, v := range vs {
		out = binary.LittleEndian.AppendUint32(out, math.Float32bits(v))
	}
	return out
}
