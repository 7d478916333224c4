package gpu

import (
	"bytes"
	"encoding/binary"
	"maps"
	"os"
	"runtime"
	"slices"
	"testing"
)

// FuzzReadSafetensors feeds arbitrary bytes to the safetensors reader and
// every loader built on it (weights, token batch, embeddings). The seeds are
// a weights file of tinyConfig, one with F16 and BF16 tensors, a token
// batch, the Python-written embeddings file and a few files from the
// format's reference test suite. Invariants:
//   - nothing panics;
//   - reading allocates at most a fixed multiple of the input's size, so a
//     header claiming huge shapes or lengths costs nothing;
//   - an accepted file's tensors tile its data buffer, and writing them
//     back out with writeSafetensors reads back the same names, dtypes,
//     shapes, bytes and metadata;
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
	writeSafetensors(&buf, map[string]string{"format": EmbedWeightsFormat, "max_tokens": "3"}, []stOut{
		{name: "embedding", shape: []int64{2, 1}, dtype: "F16", raw: []byte{0, 0x3c, 0x01, 0x80}},
		{name: "w1", shape: []int64{1, 2}, dtype: "BF16", raw: []byte{0x80, 0x3f, 0x49, 0xc0}},
		{name: "b1", shape: []int64{2}, f32: []float32{0.5, -0.5}},
		{name: "w2", shape: []int64{2, 1}, f32: []float32{1, 2}},
		{name: "b2", shape: []int64{1}, f32: []float32{0.25}},
	})
	f.Add(buf.Bytes())
	if py, err := os.ReadFile("testdata/embeddings-python.safetensors"); err == nil {
		f.Add(py)
	}
	f.Add(stBytes(`{"attn.0":{"dtype":"F32","shape":[1,2,3],"data_offsets":[0,24]}}`, f32Bytes(0, 1, 2, 3, 4, 5)))
	f.Add(stBytes(`{"__metadata__":{"framework":"pt"},"test":{"dtype":"I32","shape":[2,0],"data_offsets":[0,0]}}`, nil))
	f.Add(stBytes(`{"test":{"dtype":"I32","shape":[2,9223372036854775807],"data_offsets":[0,16]}}`, make([]byte, 16)))
	// A header length just under the limit, in a file of a few bytes.
	f.Add(append(binary.LittleEndian.AppendUint64(nil, stMaxHeader-1), "{}"...))

	f.Fuzz(func(t *testing.T, data []byte) {
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		file, err := readBytes(data)
		var raws [][]byte
		if err == nil {
			for i := range file.tensors {
				raw, err := file.raw(&file.tensors[i])
				if err != nil {
					t.Fatalf("accepted file, tensor %q unreadable: %v", file.tensors[i].name, err)
				}
				raws = append(raws, raw)
			}
		}
		w, wcfg, werr := ReadEmbedWeights(bytes.NewReader(data), int64(len(data)))
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
				t.Fatalf("readSafetensors refused (%v) what a loader took", err)
			}
			return
		}
		var at int64
		for _, st := range file.tensors {
			if st.begin != at {
				t.Fatalf("tensor %q starts at %d, want %d", st.name, st.begin, at)
			}
			at = st.end
		}
		if at != int64(len(data))-file.base {
			t.Fatalf("tensors end at %d of a %d-byte buffer", at, int64(len(data))-file.base)
		}
		var out []stOut
		for i, st := range file.tensors {
			out = append(out, stOut{name: st.name, shape: st.shape, dtype: st.dtype, raw: raws[i]})
		}
		buf := new(bytes.Buffer)
		if err := writeSafetensors(buf, file.metadata, out); err != nil {
			t.Fatalf("write back: %v", err)
		}
		again, err := readBytes(buf.Bytes())
		if err != nil {
			t.Fatalf("read what was written back: %v", err)
		}
		if !maps.Equal(again.metadata, file.metadata) || len(again.tensors) != len(file.tensors) {
			t.Fatalf("written back: metadata %v and %d tensors, want %v and %d", again.metadata, len(again.tensors), file.metadata, len(file.tensors))
		}
		for i, st := range again.tensors {
			raw, _ := again.raw(&st)
			old := file.tensors[i]
			if st.name != old.name || st.dtype != old.dtype || !slices.Equal(st.shape, old.shape) || !bytes.Equal(raw, raws[i]) {
				t.Fatalf("written back: tensor %d is %q %s %v, want %q %s %v", i, st.name, st.dtype, st.shape, old.name, old.dtype, old.shape)
			}
		}

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
			if err := WriteEmbedWeights(buf, wcfg, w); err != nil {
				t.Fatalf("write accepted weights: %v", err)
			}
			w2, cfg2, err := ReadEmbedWeights(bytes.NewReader(buf.Bytes()), int64(buf.Len()))
			if err != nil || cfg2 != wcfg || !sameBits(w2.Embedding, w.Embedding) || !sameBits(w2.W1, w.W1) ||
				!sameBits(w2.B1, w.B1) || !sameBits(w2.W2, w.W2) || !sameBits(w2.B2, w.B2) {
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
