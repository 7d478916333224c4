// Package safetensors is a minimal, strict reader and writer of the
// safetensors format
// (https://github.com/huggingface/safetensors), written here rather than
// taken from a module because the format is small and the loader must be
// strict about files that users bring:
//
//	8 bytes   N, the header's length, unsigned little-endian
//	N bytes   the header: a JSON object, UTF-8, starting with '{' and
//	          possibly padded at the end with whitespace. Each member is
//	          a tensor, "name": {"dtype": "F32", "shape": [2, 3],
//	          "data_offsets": [begin, end]}, except "__metadata__", an
//	          optional object of strings to strings
//	the rest  the data buffer: each tensor's bytes at [begin, end) of it,
//	          row-major (C order), little-endian
//
// Beyond what the format's own reader checks (the header length bounded
// and within the file, valid UTF-8 JSON, each tensor's byte length equal to
// the product of its shape times its dtype's size, the tensors tiling the
// buffer with no overlap and no gap up to its very end), this one also
// refuses duplicate keys (which the format disallows and encoding/json would
// silently resolve to the last), unknown fields in a tensor's entry, numbers
// that are not plain non-negative integers, and a header that does not
// start with '{' (the format says it must; the reference reader still lets
// leading whitespace through).
package safetensors

import (
	"bufio"
	"bytes"
	"cmp"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
)

// MaxHeader is the largest header accepted, the reference
// implementation's own limit, so that any file it reads this reads too,
// and a hostile length cannot make the reader allocate more.
const MaxHeader = 100_000_000

// stChunk is how many bytes of a tensor are read at a time: tensors are
// decoded through one small buffer straight into their final slice, so a
// file is never held in memory twice. A multiple of every element size.
const stChunk = 64 << 10

// stDTypeSize is the size in bytes of an element of each dtype the format
// defines with a whole number of bytes. A file holding any other (the
// sub-byte F4 and F6 types, or one defined later) is refused with the
// tensor's name and dtype, since its byte lengths cannot be checked.
var stDTypeSize = map[string]int64{
	"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "F8_E8M0": 1,
	"I16": 2, "U16": 2, "F16": 2, "BF16": 2,
	"I32": 4, "U32": 4, "F32": 4,
	"I64": 8, "U64": 8, "F64": 8,
}

// stTensor is a tensor's entry in a safetensors header.
type stTensor struct {
	name       string
	dtype      string
	shape      []int64
	begin, end int64 // its bytes in the data buffer
}

// File is a validated safetensors file: its header, and where its data
// lies in the reader it came from. Tensors are read on demand, so a caller
// can check names and shapes before allocating anything.
type File struct {
	r        io.ReaderAt
	base     int64      // where the data buffer starts in r: 8 + N
	tensors  []stTensor // in the order of their data
	metadata map[string]string
}

// read reads and validates the header of the size-byte file r.
// Every error says what is wrong and where.
func read(r io.ReaderAt, size int64) (*File, error) {
	if size < 8 {
		return nil, fmt.Errorf("safetensors: file of %d bytes, too short for the 8-byte header length", size)
	}
	var lenBuf [8]byte
	if err := readFullAt(r, lenBuf[:], 0); err != nil {
		return nil, fmt.Errorf("safetensors: read the header length: %w", err)
	}
	n := binary.LittleEndian.Uint64(lenBuf[:])
	if n > MaxHeader {
		return nil, fmt.Errorf("safetensors: header length %d is over the limit of %d bytes", n, MaxHeader)
	}
	if int64(n) > size-8 {
		return nil, fmt.Errorf("safetensors: header length %d runs past the end of the file (%d bytes after the length)", n, size-8)
	}
	header := make([]byte, n)
	if err := readFullAt(r, header, 8); err != nil {
		return nil, fmt.Errorf("safetensors: read the header: %w", err)
	}
	base := 8 + int64(n)
	tensors, metadata, err := parseSafetensorsHeader(header, size-base)
	if err != nil {
		return nil, fmt.Errorf("safetensors: %w", err)
	}
	return &File{r: r, base: base, tensors: tensors, metadata: metadata}, nil
}

// parseSafetensorsHeader parses and validates a header against a data
// buffer of dataLen bytes, returning the tensors in the order of their data.
func parseSafetensorsHeader(header []byte, dataLen int64) ([]stTensor, map[string]string, error) {
	if !utf8.Valid(header) {
		return nil, nil, errors.New("header is not valid UTF-8")
	}
	if len(header) == 0 || header[0] != '{' {
		return nil, nil, errors.New("header does not start with '{'")
	}
	var tensors []stTensor
	var metadata map[string]string
	err := jsonObject(header, func(key string, value json.RawMessage) error {
		if key == "__metadata__" {
			m, err := parseStringMap(value)
			if err != nil {
				return fmt.Errorf("__metadata__: %w", err)
			}
			metadata = m
			return nil
		}
		t, err := parseTensorEntry(key, value)
		if err != nil {
			return fmt.Errorf("tensor %q: %w", key, err)
		}
		tensors = append(tensors, t)
		return nil
	})
	if err != nil {
		return nil, nil, fmt.Errorf("header: %w", err)
	}

	for _, t := range tensors {
		size, ok := stDTypeSize[t.dtype]
		if !ok {
			return nil, nil, fmt.Errorf("tensor %q: dtype %q is not one this reader knows", t.name, t.dtype)
		}
		nbytes, ok := shapeBytes(t.shape, size)
		if !ok {
			return nil, nil, fmt.Errorf("tensor %q: shape %v of %s overflows int64 bytes", t.name, t.shape, t.dtype)
		}
		if t.begin > t.end {
			return nil, nil, fmt.Errorf("tensor %q: data_offsets [%d, %d] end before they begin", t.name, t.begin, t.end)
		}
		if got := t.end - t.begin; got != nbytes {
			return nil, nil, fmt.Errorf("tensor %q: shape %v of %s is %d bytes, but data_offsets [%d, %d] hold %d",
				t.name, t.shape, t.dtype, nbytes, t.begin, t.end, got)
		}
		if t.end > dataLen {
			return nil, nil, fmt.Errorf("tensor %q: data_offsets [%d, %d] run past the data buffer (%d bytes)", t.name, t.begin, t.end, dataLen)
		}
	}

	// The format requires the tensors to tile the buffer: sorted by
	// offset, each starts where the previous ended and the last ends at
	// the end of the file. So no byte is read twice as two tensors, and
	// no byte is hidden in the file where no tensor says.
	slices.SortFunc(tensors, func(a, b stTensor) int {
		return cmp.Or(cmp.Compare(a.begin, b.begin), cmp.Compare(a.end, b.end), strings.Compare(a.name, b.name))
	})
	var at int64
	for i, t := range tensors {
		switch {
		case t.begin < at:
			return nil, nil, fmt.Errorf("tensor %q: data_offsets [%d, %d] overlap tensor %q's [%d, %d]",
				t.name, t.begin, t.end, tensors[i-1].name, tensors[i-1].begin, tensors[i-1].end)
		case t.begin > at:
			return nil, nil, fmt.Errorf("data buffer bytes [%d, %d) belong to no tensor (a gap before %q): the tensors must cover the buffer",
				at, t.begin, t.name)
		}
		at = t.end
	}
	if at != dataLen {
		return nil, nil, fmt.Errorf("data buffer is %d bytes but its tensors end at %d: the tensors must cover the buffer", dataLen, at)
	}
	return tensors, metadata, nil
}

// shapeBytes is the byte size of a tensor of shape whose elements take
// size bytes, and false if it does not fit in an int64. The product is
// checked in order, as the reference reader checks it.
func shapeBytes(shape []int64, size int64) (int64, bool) {
	n := size
	for _, d := range shape {
		if d != 0 && n > math.MaxInt64/d {
			return 0, false
		}
		n *= d
	}
	return n, true
}

// parseTensorEntry parses {"dtype": ..., "shape": [...], "data_offsets":
// [begin, end]}: all three, nothing else.
func parseTensorEntry(name string, value json.RawMessage) (stTensor, error) {
	t := stTensor{name: name}
	var haveDType, haveShape, haveOffsets bool
	err := jsonObject(value, func(key string, v json.RawMessage) error {
		switch key {
		case "dtype":
			haveDType = true
			if len(v) == 0 || v[0] != '"' {
				return fmt.Errorf("dtype is %s, want a string", v)
			}
			return json.Unmarshal(v, &t.dtype)
		case "shape":
			haveShape = true
			s, err := parseIntArray(v)
			if err != nil {
				return fmt.Errorf("shape: %w", err)
			}
			t.shape = s
		case "data_offsets":
			haveOffsets = true
			o, err := parseIntArray(v)
			if err != nil {
				return fmt.Errorf("data_offsets: %w", err)
			}
			if len(o) != 2 {
				return fmt.Errorf("data_offsets has %d numbers, want [begin, end]", len(o))
			}
			t.begin, t.end = o[0], o[1]
		default:
			return fmt.Errorf("unknown field %q (want dtype, shape, data_offsets)", key)
		}
		return nil
	})
	if err != nil {
		return t, err
	}
	for _, f := range []struct {
		have bool
		name string
	}{{haveDType, "dtype"}, {haveShape, "shape"}, {haveOffsets, "data_offsets"}} {
		if !f.have {
			return t, fmt.Errorf("no %s", f.name)
		}
	}
	return t, nil
}

// parseIntArray parses a JSON array of integers in [0, MaxInt64], written
// as plain digits: no sign, fraction, exponent, quotes or null (which
// encoding/json would quietly turn into 0 or accept for a number).
func parseIntArray(v json.RawMessage) ([]int64, error) {
	if len(v) == 0 || v[0] != '[' {
		return nil, fmt.Errorf("%s is not an array", v)
	}
	var raw []json.RawMessage
	if err := json.Unmarshal(v, &raw); err != nil {
		return nil, err
	}
	out := make([]int64, len(raw))
	for i, r := range raw {
		s := string(r)
		if s == "" || strings.Trim(s, "0123456789") != "" {
			return nil, fmt.Errorf("%s is not a non-negative integer", s)
		}
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("%s is out of range", s)
		}
		out[i] = n
	}
	return out, nil
}

// parseStringMap parses a JSON object of strings, or null (which the
// reference reader takes as no metadata).
func parseStringMap(v json.RawMessage) (map[string]string, error) {
	if string(v) == "null" {
		return nil, nil
	}
	m := map[string]string{}
	err := jsonObject(v, func(key string, v json.RawMessage) error {
		if len(v) == 0 || v[0] != '"' {
			return fmt.Errorf("%q is %s, want a string", key, v)
		}
		var s string
		if err := json.Unmarshal(v, &s); err != nil {
			return err
		}
		m[key] = s
		return nil
	})
	return m, err
}

// jsonObject calls fn with each member of the JSON object data, in order.
// It refuses anything but one object (and trailing whitespace), and a key
// seen twice: encoding/json would keep the last one silently.
func jsonObject(data []byte, fn func(key string, value json.RawMessage) error) error {
	// Syntax errors can only come from the outermost call: the values
	// passed to fn have been checked by the decoder already.
	dec := json.NewDecoder(bytes.NewReader(data))
	tok, err := dec.Token()
	if err != nil {
		return fmt.Errorf("not valid JSON: %w", err)
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return fmt.Errorf("found %s, want an object", describeToken(tok))
	}
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return fmt.Errorf("not valid JSON: %w", err)
		}
		key, ok := tok.(string)
		if !ok { // the decoder allows nothing else here; kept for safety
			return fmt.Errorf("found %s, want a key", describeToken(tok))
		}
		if seen[key] {
			return fmt.Errorf("key %q appears twice", key)
		}
		seen[key] = true
		var value json.RawMessage
		if err := dec.Decode(&value); err != nil {
			return fmt.Errorf("not valid JSON: %q: %w", key, err)
		}
		if err := fn(key, value); err != nil {
			return err
		}
	}
	if _, err := dec.Token(); err != nil { // the closing '}'
		return fmt.Errorf("not valid JSON: %w", err)
	}
	if rest := bytes.TrimLeft(data[dec.InputOffset():], " \t\r\n"); len(rest) > 0 {
		return fmt.Errorf("%d more bytes after the object", len(rest))
	}
	return nil
}

// describeToken says what a JSON token is, for an error.
func describeToken(tok json.Token) string {
	switch v := tok.(type) {
	case json.Delim:
		return strconv.QuoteRune(rune(v))
	case string:
		return strconv.Quote(v)
	case nil:
		return "null"
	default:
		return fmt.Sprint(v)
	}
}

// readFullAt fills p from r at off. A ReaderAt may report io.EOF along with
// a full read at the end of its input; that is success.
func readFullAt(r io.ReaderAt, p []byte, off int64) error {
	n, err := r.ReadAt(p, off)
	if n == len(p) {
		return nil
	}
	if err == nil || err == io.EOF {
		err = io.ErrUnexpectedEOF
	}
	return err
}

// tensor is the entry of the tensor called name, or nil.
func (f *File) tensor(name string) *stTensor {
	for i := range f.tensors {
		if f.tensors[i].name == name {
			return &f.tensors[i]
		}
	}
	return nil
}

// chunks calls fn with t's bytes, in pieces of at most stChunk bytes, each
// a whole number of elements.
func (f *File) chunks(t *stTensor, fn func([]byte)) error {
	buf := make([]byte, min(stChunk, t.end-t.begin))
	for off := t.begin; off < t.end; {
		p := buf[:min(int64(len(buf)), t.end-off)]
		if err := readFullAt(f.r, p, f.base+off); err != nil {
			return fmt.Errorf("safetensors: read tensor %q: %w", t.name, err)
		}
		fn(p)
		off += int64(len(p))
	}
	return nil
}

// float32s reads t as float32 values. F32 is read as it is; F16 and BF16
// are widened, which is exact (every value of either is a float32 value),
// so a half-precision checkpoint gives every backend the same float32
// weights. Other dtypes are refused: narrowing F64 would round, and the
// choice of rounding belongs to whoever exports the weights.
func (f *File) float32s(t *stTensor) ([]float32, error) {
	n := int(t.end - t.begin)
	var out []float32
	var err error
	switch t.dtype {
	case "F32":
		out = make([]float32, 0, n/4)
		err = f.chunks(t, func(p []byte) {
			for i := 0; i < len(p); i += 4 {
				out = append(out, math.Float32frombits(binary.LittleEndian.Uint32(p[i:])))
			}
		})
	case "F16", "BF16":
		widen := f16ToF32
		if t.dtype == "BF16" {
			widen = bf16ToF32
		}
		out = make([]float32, 0, n/2)
		err = f.chunks(t, func(p []byte) {
			for i := 0; i < len(p); i += 2 {
				out = append(out, widen(binary.LittleEndian.Uint16(p[i:])))
			}
		})
	default:
		return nil, fmt.Errorf("safetensors: tensor %q is %s, want F32 (or F16 or BF16, widened to float32)", t.name, t.dtype)
	}
	return out, err
}

// f16ToF32 widens an IEEE 754 binary16 value to float32, exactly: NaN
// payloads, infinities, signed zeros and subnormals included.
func f16ToF32(h uint16) float32 {
	sign := uint32(h>>15) << 31
	exp := uint32(h>>10) & 0x1f
	mant := uint32(h) & 0x3ff
	switch {
	case exp == 0x1f: // infinity or NaN
		return math.Float32frombits(sign | 0xff<<23 | mant<<13)
	case exp != 0: // normal: rebias the exponent from 15 to 127
		return math.Float32frombits(sign | (exp+127-15)<<23 | mant<<13)
	default: // zero or subnormal: mant × 2⁻²⁴, a normal float32
		v := float32(mant) * (1.0 / (1 << 24))
		return math.Float32frombits(sign | math.Float32bits(v))
	}
}

// bf16ToF32 widens a bfloat16, the top half of a float32, to float32.
func bf16ToF32(b uint16) float32 { return math.Float32frombits(uint32(b) << 16) }

// stOut is a tensor to write: F32 values, I32 values, or raw bytes of
// dtype (for tests).
type stOut struct {
	name  string
	shape []int64
	f32   []float32
	i32   []int32
	dtype string // with raw
	raw   []byte
}

// stHeaderEntry is a tensor's header entry as written.
type stHeaderEntry struct {
	DType       string   `json:"dtype"`
	Shape       []int64  `json:"shape"`
	DataOffsets [2]int64 `json:"data_offsets"`
}

// writeSafetensors writes tensors, in the order given, and metadata (none
// when empty) as a safetensors file. The header is padded with spaces to a
// multiple of 8 bytes, as the reference writer pads it, so that the data
// of a file mapped into memory is aligned for any dtype.
func writeSafetensors(w io.Writer, metadata map[string]string, tensors []stOut) error {
	header := map[string]any{}
	if len(metadata) > 0 {
		header["__metadata__"] = metadata
	}
	var off int64
	for i := range tensors {
		t := &tensors[i]
		var n int64
		switch {
		case t.f32 != nil:
			t.dtype, n = "F32", int64(len(t.f32))*4
		case t.i32 != nil:
			t.dtype, n = "I32", int64(len(t.i32))*4
		default:
			n = int64(len(t.raw))
		}
		size, ok := stDTypeSize[t.dtype]
		if !ok {
			return fmt.Errorf("safetensors: tensor %q: unknown dtype %q", t.name, t.dtype)
		}
		if want, ok := shapeBytes(t.shape, size); !ok || want != n || slices.ContainsFunc(t.shape, func(d int64) bool { return d < 0 }) {
			return fmt.Errorf("safetensors: tensor %q: %d bytes of data for shape %v of %s", t.name, n, t.shape, t.dtype)
		}
		if _, dup := header[t.name]; dup || t.name == "__metadata__" {
			return fmt.Errorf("safetensors: tensor name %q used twice or reserved", t.name)
		}
		shape := t.shape
		if shape == nil {
			shape = []int64{} // a scalar: [] in the header, not null
		}
		header[t.name] = stHeaderEntry{DType: t.dtype, Shape: shape, DataOffsets: [2]int64{off, off + n}}
		off += n
	}
	js, err := json.Marshal(header)
	if err != nil {
		return fmt.Errorf("safetensors: %w", err)
	}
	js = append(js, bytes.Repeat([]byte{' '}, (8-len(js)%8)%8)...)

	bw := bufio.NewWriterSize(w, stChunk)
	var lenBuf [8]byte
	binary.LittleEndian.PutUint64(lenBuf[:], uint64(len(js)))
	bw.Write(lenBuf[:])
	bw.Write(js)
	var b [4]byte
	for _, t := range tensors {
		// bufio.Writer's error is sticky: checked once, at Flush.
		switch {
		case t.f32 != nil:
			for _, v := range t.f32 {
				binary.LittleEndian.PutUint32(b[:], math.Float32bits(v))
				bw.Write(b[:])
			}
		case t.i32 != nil:
			for _, v := range t.i32 {
				binary.LittleEndian.PutUint32(b[:], uint32(v))
				bw.Write(b[:])
			}
		default:
			bw.Write(t.raw)
		}
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("safetensors: write: %w", err)
	}
	return nil
}
