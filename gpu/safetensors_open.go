package gpu

import (
	"io"
	"slices"
)

// Safetensors is a validated safetensors file (see the format's notes in
// safetensors.go) whose tensors are read on demand, exported so that the
// model packages read checkpoints through the same strict codec as the
// reference model rather than through a second one.
type Safetensors struct{ f *safetensorsFile }

// TensorInfo is a tensor's header entry.
type TensorInfo struct {
	Name  string
	DType string  // "F32", "F16", "BF16", ...
	Shape []int64 // row-major
}

// OpenSafetensors reads and validates the header of the size-byte file r.
// r must stay open while tensors are read.
func OpenSafetensors(r io.ReaderAt, size int64) (*Safetensors, error) {
	f, err := readSafetensors(r, size)
	if err != nil {
		return nil, err
	}
	return &Safetensors{f: f}, nil
}

// Tensor is the header entry of the tensor called name, and false if the
// file has none.
func (s *Safetensors) Tensor(name string) (TensorInfo, bool) {
	t := s.f.tensor(name)
	if t == nil {
		return TensorInfo{}, false
	}
	return TensorInfo{Name: t.name, DType: t.dtype, Shape: slices.Clone(t.shape)}, true
}

// Names lists the file's tensors in the order of their data.
func (s *Safetensors) Names() []string {
	names := make([]string, len(s.f.tensors))
	for i, t := range s.f.tensors {
		names[i] = t.name
	}
	return names
}

// Float32s reads the tensor called name as float32 values: F32 as it is,
// F16 and BF16 widened exactly; any other dtype is an error.
func (s *Safetensors) Float32s(name string) ([]float32, error) {
	t := s.f.tensor(name)
	if t == nil {
		return nil, &missingTensorError{name}
	}
	return s.f.float32s(t)
}

type missingTensorError struct{ name string }

func (e *missingTensorError) Error() string { return "safetensors: no tensor " + e.name }

// SafetensorsTensor is a float32 tensor to write with WriteSafetensors.
type SafetensorsTensor struct {
	Name   string
	Shape  []int64
	Values []float32
}

// WriteSafetensors writes float32 tensors, in the order given, and
// metadata (none when empty) as a safetensors file that OpenSafetensors
// reads back. It is how tests and tools generate checkpoints.
func WriteSafetensors(w io.Writer, metadata map[string]string, tensors []SafetensorsTensor) error {
	out := make([]stOut, len(tensors))
	for i, t := range tensors {
		v := t.Values
		if v == nil {
			v = []float32{} // an empty tensor is still F32, not raw bytes
		}
		out[i] = stOut{name: t.Name, shape: t.Shape, f32: v}
	}
	return writeSafetensors(w, metadata, out)
}
