package safetensors

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
)

// stBytes is a safetensors file of header (unpadded) and data, spelled out
// by hand rather than by writeSafetensors, so that malformed ones can be.
func stBytes(header string, data []byte) []byte {
	out := binary.LittleEndian.AppendUint64(nil, uint64(len(header)))
	out = append(out, header...)
	return append(out, data...)
}

// f32Bytes is vs as F32 data.
func f32Bytes(vs ...float32) []byte {
	var out []byte
	for _, v := range vs {
		out = binary.LittleEndian.AppendUint32(out, math.Float32bits(v))
	}
	return out
}

func readBytes(data []byte) (*File, error) {
	return read(bytes.NewReader(data), int64(len(data)))
}

// TestReadSafetensorsReferenceVectors reads files from the test suite of
// the format's reference implementation (huggingface/safetensors,
// safetensors/src/tensor.rs), with the outcome it expects, so that this
// reader is tested against bytes its own writer did not make. The one
// departure is noted.
func TestReadSafetensorsReferenceVectors(t *testing.T) {
	zeros := func(n int) string { return strings.Repeat("\x00", n) }
	i32x4 := `{"test":{"dtype":"I32","shape":[2,2],"data_offsets":[0,16]}}`
	tests := []struct {
		name string
		file string
		want string // error text; "" to accept
	}{
		// test_serialization: an F32 tensor [1,2,3] of 0..5, unpadded 64-byte header.
		{"serialization", string(stBytes(`{"attn.0":{"dtype":"F32","shape":[1,2,3],"data_offsets":[0,24]}}`, f32Bytes(0, 1, 2, 3, 4, 5))), ""},
		// test_serialization_forced_alignement: the header padded with spaces to 72 bytes.
		{"padded header",
			string(stBytes(`{"attn0":{"dtype":"F32","shape":[1,1,2,3],"data_offsets":[0,24]}}       `, f32Bytes(0, 1, 2, 3, 4, 5))), ""},
		{"empty", "\x08" + zeros(7) + "{}      ", ""},
		{"metadata only", "\x28" + zeros(7) + `{"__metadata__":{"framework":"pt"}}     `, ""},
		{"scalar", "8" + zeros(7) + `{"test":{"dtype":"I32","shape":[],"data_offsets":[0,4]}}` + zeros(4), ""},
		{"deserialization", "<" + zeros(7) + i32x4 + zeros(16), ""},
		{"zero-sized", "<" + zeros(7) + `{"test":{"dtype":"I32","shape":[2,0],"data_offsets":[0, 0]}}`, ""},
		{"whitespace padding", "\x06" + zeros(7) + "{}\r \t\n", ""},
		{"extra data", "<" + zeros(7) + i32x4 + zeros(16) + "extra_bogus_data_for_polyglot_file", "tensors must cover the buffer"},
		{"missing data", "<" + zeros(7) + i32x4 + zeros(14), "run past the data buffer"},
		{"header too large", "<\x00\x00\x00\x00\xff\xff\xff" + i32x4 + zeros(16), "over the limit"},
		{"too small", "", "too short"},
		{"header past the end", "<" + zeros(7), "runs past the end of the file"},
		{"not UTF-8", "\x01" + zeros(7) + "\xff", "not valid UTF-8"},
		{"not JSON", "\x01" + zeros(7) + "{", "header: not valid JSON"},
		{"invalid info", "<" + zeros(7) + `{"test":{"dtype":"I32","shape":[2,2],"data_offsets":[0, 4]}}`,
			"is 16 bytes, but data_offsets [0, 4] hold 4"},
		{"shape overflow", "O" + zeros(7) + `{"test":{"dtype":"I32","shape":[2,18446744073709551614],"data_offsets":[0,16]}}` + zeros(16),
			"out of range"},
		{"bytes overflow", "N" + zeros(7) + `{"test":{"dtype":"I32","shape":[2,9223372036854775807],"data_offsets":[0,16]}}` + zeros(16),
			"overflows int64"},
		// test_json_attack: ten tensors claiming the same 16 bytes.
		{"json attack", string(stBytes(jsonAttackHeader(), make([]byte, 16))), "overlap"},
		// The reference reader still lets leading whitespace through (it
		// reserves the check for its 0.4.0); the format says the header
		// MUST start with '{', and this reader holds to it.
		{"leading whitespace", "\x06" + zeros(7) + "\t\n{}\r ", "does not start with '{'"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := readBytes([]byte(tt.file))
			if tt.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v, want one saying %q", err, tt.want)
			}
		})
	}

	// What the accepted ones hold.
	f, err := readBytes(stBytes(`{"attn.0":{"dtype":"F32","shape":[1,2,3],"data_offsets":[0,24]}}`, f32Bytes(0, 1, 2, 3, 4, 5)))
	if err != nil {
		t.Fatal(err)
	}
	if v, err := f.float32s(f.tensor("attn.0")); err != nil || !slices.Equal(v, []float32{0, 1, 2, 3, 4, 5}) {
		t.Errorf("attn.0 = %v, %v; want 0..5", v, err)
	}
	f, err = readBytes([]byte("\x28" + zeros(7) + `{"__metadata__":{"framework":"pt"}}     `))
	if err != nil || f.metadata["framework"] != "pt" || len(f.tensors) != 0 {
		t.Errorf("metadata only: %+v, %v", f, err)
	}
	f, err = readBytes([]byte("<" + zeros(7) + `{"test":{"dtype":"I32","shape":[2,0],"data_offsets":[0, 0]}}`))
	if err != nil || !slices.Equal(f.tensor("test").shape, []int64{2, 0}) {
		t.Errorf("zero-sized: %+v, %v", f, err)
	}
	if v, err := f.Int32s("test"); err != nil || len(v) != 0 {
		t.Errorf("zero-sized tensor read as %v, %v", v, err)
	}
}

// TestF16ToF32 checks every binary16 value against its definition,
// (-1)^s × 2^(e-15) × 1.m, or 2^-14 × 0.m for subnormals.
func TestF16ToF32(t *testing.T) {
	for h := range 1 << 16 {
		got := f16ToF32(uint16(h))
		sign, exp, mant := h>>15, (h>>10)&0x1f, h&0x3ff
		var want float64
		switch {
		case exp == 0x1f && mant == 0:
			want = math.Inf(1)
		case exp == 0x1f:
			if !math.IsNaN(float64(got)) || math.Float32bits(got)>>13&0x3ff != uint32(mant) {
				t.Fatalf("f16ToF32(%#04x) = %v (%#08x), want NaN with payload %#x", h, got, math.Float32bits(got), mant)
			}
			continue
		case exp == 0:
			want = math.Ldexp(float64(mant)/1024, -14)
		default:
			want = math.Ldexp(1+float64(mant)/1024, exp-15)
		}
		if sign == 1 {
			want = math.Copysign(want, -1)
		}
		if float64(got) != want || math.Signbit(float64(got)) != math.Signbit(want) {
			t.Fatalf("f16ToF32(%#04x) = %v, want %v", h, got, want)
		}
	}
	if got := bf16ToF32(0x3f80); got != 1 {
		t.Errorf("bf16ToF32(0x3f80) = %v, want 1", got)
	}
	if got := bf16ToF32(0xc049); got != -3.140625 {
		t.Errorf("bf16ToF32(0xc049) = %v, want -3.140625", got)
	}
}

func TestWriteSafetensorsRefuses(t *testing.T) {
	for _, tt := range []struct {
		name    string
		tensors []stOut
		want    string
	}{
		{"shape and data", []stOut{{name: "a", shape: []int64{3}, f32: []float32{1, 2}}}, "8 bytes of data for shape [3] of F32"},
		{"negative dim", []stOut{{name: "a", shape: []int64{-1, -2}, f32: []float32{1, 2}}}, "shape [-1 -2]"},
		{"unknown dtype", []stOut{{name: "a", shape: []int64{1}, dtype: "F4", raw: []byte{0}}}, `unknown dtype "F4"`},
		{"duplicate", []stOut{{name: "a", shape: []int64{1}, f32: []float32{1}}, {name: "a", shape: []int64{1}, f32: []float32{1}}},
			`"a" used twice`},
		{"reserved", []stOut{{name: "__metadata__", shape: []int64{1}, f32: []float32{1}}}, "reserved"},
	} {
		var buf bytes.Buffer
		if err := writeSafetensors(&buf, nil, tt.tensors); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: %v, want an error saying %q", tt.name, err, tt.want)
		}
		if buf.Len() > 0 {
			t.Errorf("%s: wrote %d bytes before refusing", tt.name, buf.Len())
		}
	}
}

func jsonAttackHeader() string {
	var parts []string
	for i := range 10 {
		parts = append(parts, fmt.Sprintf(`"weight_%d":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}`, i))
	}
	return "{" + strings.Join(parts, ",") + "}"
}
