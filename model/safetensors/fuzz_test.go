package safetensors

import (
	"bytes"
	"encoding/binary"
	"maps"
	"os"
	"slices"
	"testing"
)

// FuzzRead feeds arbitrary bytes to the reader. The seeds are a file with
// F16 and BF16 tensors, the Python-written embeddings file of the reference
// model's tests and a few files from the format's reference test suite;
// model/refembed's FuzzReadSafetensors feeds the loaders built on the
// reader. Invariants:
//   - nothing panics;
//   - an accepted file's tensors tile its data buffer, and writing them
//     back out with writeSafetensors reads back the same names, dtypes,
//     shapes, bytes and metadata.
func FuzzRead(f *testing.F) {
	var buf bytes.Buffer
	writeSafetensors(&buf, map[string]string{"format": "vramq-ref-embed-v1", "max_tokens": "3"}, []stOut{
		{name: "embedding", shape: []int64{2, 1}, dtype: "F16", raw: []byte{0, 0x3c, 0x01, 0x80}},
		{name: "w1", shape: []int64{1, 2}, dtype: "BF16", raw: []byte{0x80, 0x3f, 0x49, 0xc0}},
		{name: "b1", shape: []int64{2}, f32: []float32{0.5, -0.5}},
		{name: "w2", shape: []int64{2, 1}, f32: []float32{1, 2}},
		{name: "b2", shape: []int64{1}, f32: []float32{0.25}},
	})
	f.Add(buf.Bytes())
	if py, err := os.ReadFile("../refembed/testdata/embeddings-python.safetensors"); err == nil {
		f.Add(py)
	}
	f.Add(stBytes(`{"attn.0":{"dtype":"F32","shape":[1,2,3],"data_offsets":[0,24]}}`, f32Bytes(0, 1, 2, 3, 4, 5)))
	f.Add(stBytes(`{"__metadata__":{"framework":"pt"},"test":{"dtype":"I32","shape":[2,0],"data_offsets":[0,0]}}`, nil))
	f.Add(stBytes(`{"test":{"dtype":"I32","shape":[2,9223372036854775807],"data_offsets":[0,16]}}`, make([]byte, 16)))
	// A header length just under the limit, in a file of a few bytes.
	f.Add(append(binary.LittleEndian.AppendUint64(nil, MaxHeader-1), "{}"...))

	f.Fuzz(func(t *testing.T, data []byte) {
		file, err := readBytes(data)
		if err != nil {
			return
		}
		var raws [][]byte
		for i := range file.tensors {
			raw, err := file.Raw(file.tensors[i].name)
			if err != nil {
				t.Fatalf("accepted file, tensor %q unreadable: %v", file.tensors[i].name, err)
			}
			raws = append(raws, raw)
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
			t.Fatalf("written back: metadata %v and %d tensors, want %v and %d", again.metadata, len(again.tensors), file.metadata,
				len(file.tensors))
		}
		for i, st := range again.tensors {
			raw, _ := again.Raw(st.name)
			old := file.tensors[i]
			if st.name != old.name || st.dtype != old.dtype || !slices.Equal(st.shape, old.shape) || !bytes.Equal(raw, raws[i]) {
				t.Fatalf("written back: tensor %d is %q %s %v, want %q %s %v", i, st.name, st.dtype, st.shape, old.name, old.dtype, old.shape)
			}
		}

	})
}
