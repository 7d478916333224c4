package safetensors

import (
	"encoding/binary"
	"fmt"
	"io"
	"maps"
	"slices"
)

// TensorInfo is a tensor's header entry.
type TensorInfo struct {
	Name  string
	DType string  // "F32", "F16", "BF16", "I32", ...
	Shape []int64 // row-major
}

// Open reads and validates the header of the size-byte file r. Every error
// says what is wrong and where. r must stay open while tensors are read.
func Open(r io.ReaderAt, size int64) (*File, error) { return read(r, size) }

// Metadata is the header's "__metadata__" (empty when it has none).
func (f *File) Metadata() map[string]string { return maps.Clone(f.metadata) }

// Tensor is the header entry of the tensor called name, and false if the
// file has none.
func (f *File) Tensor(name string) (TensorInfo, bool) {
	t := f.tensor(name)
	if t == nil {
		return TensorInfo{}, false
	}
	return TensorInfo{Name: t.name, DType: t.dtype, Shape: slices.Clone(t.shape)}, true
}

// Names lists the file's tensors in the order of their data.
func (f *File) Names() []string {
	names := make([]string, len(f.tensors))
	for i, t := range f.tensors {
		names[i] = t.name
	}
	return names
}

// Float32s reads the tensor called name as float32 values: F32 as it is,
// F16 and BF16 widened exactly; any other dtype is an error.
func (f *File) Float32s(name string) ([]float32, error) {
	t := f.tensor(name)
	if t == nil {
		return nil, &missingTensorError{name}
	}
	return f.float32s(t)
}

// Int32s reads the tensor called name, which must be I32, as int32 values.
// No model reads I32 (the reference model's token batches, which the GPU
// checks hand to PyTorch, are their only use, from refembed's tests).
func (f *File) Int32s(name string) ([]int32, error) {
	t := f.tensor(name)
	if t == nil {
		return nil, &missingTensorError{name}
	}
	if t.dtype != "I32" {
		return nil, fmt.Errorf("safetensors: tensor %q is %s, want I32", t.name, t.dtype)
	}
	out := make([]int32, 0, (t.end-t.begin)/4)
	err := f.chunks(t, func(p []byte) {
		for i := 0; i < len(p); i += 4 {
			out = append(out, int32(binary.LittleEndian.Uint32(p[i:])))
		}
	})
	return out, err
}

// Raw is the bytes of the tensor called name as they are in the file. Only
// tests read it (refembed's fuzz target and token batch checks).
func (f *File) Raw(name string) ([]byte, error) {
	t := f.tensor(name)
	if t == nil {
		return nil, &missingTensorError{name}
	}
	out := make([]byte, 0, t.end-t.begin)
	err := f.chunks(t, func(p []byte) { out = append(out, p...) })
	return out, err
}

type missingTensorError struct{ name string }

func (e *missingTensorError) Error() string { return "safetensors: no tensor " + e.name }

// Tensor is a tensor to write with Write: float32 Values; or, when Int32s
// is set, int32 values (I32); or, when DType is set, Raw bytes of that
// dtype (little-endian), which is how tests write half-precision
// checkpoints.
type Tensor struct {
	Name   string
	Shape  []int64
	Values []float32
	Int32s []int32
	DType  string
	Raw    []byte
}

// Write writes tensors, in the order given, and metadata (none when empty)
// as a safetensors file that Open reads back. The header is padded with
// spaces to a multiple of 8 bytes, as the reference writer pads it, so that
// the data of a file mapped into memory is aligned for any dtype.
func Write(w io.Writer, metadata map[string]string, tensors []Tensor) error {
	out := make([]stOut, len(tensors))
	for i, t := range tensors {
		switch {
		case t.DType != "":
			raw := t.Raw
			if raw == nil {
				raw = []byte{}
			}
			out[i] = stOut{name: t.Name, shape: t.Shape, dtype: t.DType, raw: raw}
		case t.Int32s != nil:
			out[i] = stOut{name: t.Name, shape: t.Shape, i32: t.Int32s}
		default:
			v := t.Values
			if v == nil {
				v = []float32{} // an empty tensor is still F32, not raw bytes
			}
			out[i] = stOut{name: t.Name, shape: t.Shape, f32: v}
		}
	}
	return writeSafetensors(w, metadata, out)
}
