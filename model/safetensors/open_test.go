package safetensors

import (
	"bytes"
	"slices"
	"testing"
)

// TestSafetensorsExported round-trips a file through the exported writer
// and reader, and reads an F16 tensor through Float32s.
func TestSafetensorsExported(t *testing.T) {
	var buf bytes.Buffer
	err := Write(&buf, nil, []Tensor{
		{Name: "a", Shape: []int64{2, 2}, Values: []float32{1, -2, 3.5, 0}},
		{Name: "b", Shape: []int64{0}},
	})
	if err != nil {
		t.Fatal(err)
	}
	s, err := Open(bytes.NewReader(buf.Bytes()), int64(buf.Len()))
	if err != nil {
		t.Fatal(err)
	}
	if got := s.Names(); !slices.Equal(got, []string{"a", "b"}) {
		t.Errorf("Names() = %q, want [a b]", got)
	}
	info, ok := s.Tensor("a")
	if !ok || info.DType != "F32" || !slices.Equal(info.Shape, []int64{2, 2}) {
		t.Errorf("Tensor(a) = %+v, %v", info, ok)
	}
	if v, err := s.Float32s("a"); err != nil || !slices.Equal(v, []float32{1, -2, 3.5, 0}) {
		t.Errorf("Float32s(a) = %v, %v", v, err)
	}
	if _, ok := s.Tensor("c"); ok {
		t.Error("Tensor(c) found a tensor the file lacks")
	}
	if _, err := s.Float32s("c"); err == nil {
		t.Error("Float32s(c) read a tensor the file lacks")
	}

	// F16 1.0 is 0x3c00, -2.0 is 0xc000.
	buf.Reset()
	if err := Write(&buf, nil, []Tensor{{Name: "h", Shape: []int64{2}, DType: "F16", Raw: []byte{0x00, 0x3c, 0x00, 0xc0}}}); err != nil {
		t.Fatal(err)
	}
	s, err = Open(bytes.NewReader(buf.Bytes()), int64(buf.Len()))
	if err != nil {
		t.Fatal(err)
	}
	if v, err := s.Float32s("h"); err != nil || !slices.Equal(v, []float32{1, -2}) {
		t.Errorf("Float32s(h) = %v, %v", v, err)
	}
}
