package safetensors_test

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/vramq/vramq/model/refembed"
	"github.com/vramq/vramq/model/safetensors"
)

// TestReadSafetensorsRejects is the malformed files, each refused with an
// error that says what is wrong.
func TestReadSafetensorsRejects(t *testing.T) {
	entry := func(name, dtype, shape string, begin, end int) string {
		return fmt.Sprintf(`"%s":{"dtype":"%s","shape":%s,"data_offsets":[%d,%d]}`, name, dtype, shape, begin, end)
	}
	var file bytes.Buffer
	cfg := refembed.Config{Vocab: 5, Dim: 3, Hidden: 4, Out: 2, MaxTokens: 8, Seed: 7}
	if err := refembed.WriteWeights(&file, cfg, refembed.GenerateWeights(cfg)); err != nil {
		t.Fatal(err)
	}
	valid := file.Bytes()
	withLength := func(n uint64) []byte {
		out := slices.Clone(valid)
		binary.LittleEndian.PutUint64(out, n)
		return out
	}
	tests := []struct {
		name string
		file []byte
		want string
	}{
		{"empty file", nil, "file of 0 bytes, too short"},
		{"truncated length", valid[:5], "too short"},
		{"truncated header", valid[:40], "header length"},
		{"truncated data", valid[:len(valid)-1], `tensor "b2": data_offsets`},
		{"header length over the limit", withLength(safetensors.MaxHeader + 1), "header length 100000001 is over the limit of 100000000 bytes"},
		{"header length past the file", withLength(uint64(len(valid))), "runs past the end of the file"},
		{"header length of 2^64-1", withLength(math.MaxUint64), "over the limit"},
		{"bad JSON", safetensors.StBytes(`{"a":{"dtype":"F32",`, nil), "header: not valid JSON"},
		{"not an object", safetensors.StBytes(`[1,2]`, nil), "does not start with '{'"},
		{"empty header", safetensors.StBytes(``, nil), "does not start with '{'"},
		{"two objects", safetensors.StBytes(`{} {}`, nil), "bytes after the object"},
		{"trailing garbage", safetensors.StBytes(`{}x`, nil), "header: 1 more bytes after the object"},
		{"duplicate tensor", safetensors.StBytes(`{`+entry("a", "F32", "[1]", 0, 4)+","+entry("a", "F32", "[1]", 4, 8)+`}`, make([]byte, 8)),
			`key "a" appears twice`},
		{"duplicate field", safetensors.StBytes(`{"a":{"dtype":"F32","dtype":"I32","shape":[1],"data_offsets":[0,4]}}`, make([]byte, 4)),
			`key "dtype" appears twice`},
		{"unknown field", safetensors.StBytes(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"stride":[1]}}`, make([]byte, 4)),
			`tensor "a": unknown field "stride"`},
		{"no offsets", safetensors.StBytes(`{"a":{"dtype":"F32","shape":[1]}}`, make([]byte, 4)), `tensor "a": no data_offsets`},
		{"entry not an object", safetensors.StBytes(`{"a":[1]}`, nil), `tensor "a": found '[', want an object`},
		{"dtype not a string", safetensors.StBytes(`{"a":{"dtype":32,"shape":[1],"data_offsets":[0,4]}}`, make([]byte, 4)),
			"dtype is 32, want a string"},
		{"negative dim", safetensors.StBytes(`{`+entry("a", "F32", "[-1]", 0, 4)+`}`, make([]byte, 4)), "-1 is not a non-negative integer"},
		{"fractional dim", safetensors.StBytes(`{`+entry("a", "F32", "[1.0]", 0, 4)+`}`, make([]byte, 4)), "1.0 is not a non-negative integer"},
		{"exponent dim", safetensors.StBytes(`{`+entry("a", "F32", "[1e0]", 0, 4)+`}`, make([]byte, 4)), "1e0 is not a non-negative integer"},
		{"quoted dim", safetensors.StBytes(`{`+entry("a", "F32", `["1"]`, 0, 4)+`}`, make([]byte, 4)), `"1" is not a non-negative integer`},
		{"null dim", safetensors.StBytes(`{`+entry("a", "F32", `[null]`, 0, 4)+`}`, make([]byte, 4)), `null is not a non-negative integer`},
		{"null shape", safetensors.StBytes(`{"a":{"dtype":"F32","shape":null,"data_offsets":[0,4]}}`, make([]byte, 4)),
			"shape: null is not an array"},
		{"three offsets", safetensors.StBytes(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4,8]}}`, make([]byte, 4)),
			"data_offsets has 3 numbers"},
		{"unknown dtype", safetensors.StBytes(`{`+entry("a", "F4", "[2]", 0, 1)+`}`, make([]byte, 1)),
			`tensor "a": dtype "F4" is not one this reader knows`},
		{"shape and offsets disagree", safetensors.StBytes(`{`+entry("a", "F32", "[2,3]", 0, 20)+`}`, make([]byte, 20)),
			`tensor "a": shape [2 3] of F32 is 24 bytes, but data_offsets [0, 20] hold 20`},
		{"offsets reversed", safetensors.StBytes(`{`+entry("a", "F32", "[0]", 4, 0)+`}`, make([]byte, 4)), "end before they begin"},
		{"offsets past the buffer", safetensors.StBytes(`{`+entry("a", "F32", "[2]", 0, 8)+`}`, make([]byte, 4)),
			"run past the data buffer (4 bytes)"},
		{"overlap", safetensors.StBytes(`{`+entry("a", "F32", "[2]", 0, 8)+","+entry("b", "F32", "[2]", 4, 12)+`}`, make([]byte, 12)),
			`tensor "b": data_offsets [4, 12] overlap tensor "a"'s [0, 8]`},
		{"zero-sized inside another",
			safetensors.StBytes(`{`+entry("a", "F32", "[2]", 0, 8)+","+entry("b", "F32", "[0]", 4, 4)+`}`, make([]byte, 8)), "overlap"},
		{"gap", safetensors.StBytes(`{`+entry("a", "F32", "[1]", 0, 4)+","+entry("b", "F32", "[1]", 8, 12)+`}`, make([]byte, 12)),
			`data buffer bytes [4, 8) belong to no tensor (a gap before "b")`},
		{"gap at the start", safetensors.StBytes(`{`+entry("a", "F32", "[1]", 4, 8)+`}`, make([]byte, 8)), "bytes [0, 4) belong to no tensor"},
		{"bytes after the last tensor", safetensors.StBytes(`{`+entry("a", "F32", "[1]", 0, 4)+`}`, make([]byte, 8)),
			"data buffer is 8 bytes but its tensors end at 4"},
		{"metadata not strings", safetensors.StBytes(`{"__metadata__":{"max_tokens":8}}`, nil), `__metadata__: "max_tokens" is 8, want a string`},
		{"metadata not an object", safetensors.StBytes(`{"__metadata__":"v1"}`, nil), "__metadata__"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := safetensors.Open(bytes.NewReader(tt.file), int64(len(tt.file)))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v, want one saying %q", err, tt.want)
			}
			if !strings.HasPrefix(err.Error(), "safetensors: ") {
				t.Errorf("error %q does not say it is about the file format", err)
			}
			// The weights loader refuses them too, with the same error.
			if _, _, werr := refembed.ReadWeights(bytes.NewReader(tt.file), int64(len(tt.file))); werr == nil || werr.Error() != err.Error() {
				t.Errorf("refembed.ReadWeights: %v, want %v", werr, err)
			}
		})
	}
}
