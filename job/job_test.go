package job

import (
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/google/go-cmp/cmp"
)

func TestDecodeWork(t *testing.T) {
	good := `{"v":1,"job_id":"j1","chunk":2,"chunks":3,"items":[{"id":"a","text":"hello"},{"id":"b","data":"AAE="}]}`
	w, err := DecodeWork([]byte(good))
	if err != nil {
		t.Fatal(err)
	}
	want := &Work{V: 1, JobID: "j1", Chunk: 2, Chunks: 3, Items: []Item{{ID: "a", Text: "hello"}, {ID: "b", Data: []byte{0, 1}}}}
	if d := cmp.Diff(want, w); d != "" {
		t.Errorf("DecodeWork (-want +got):\n%s", d)
	}

	for _, tc := range []struct{ body, want string }{
		{`not json`, "invalid character"},
		{`{"v":2,"job_id":"j","chunk":0,"items":[{"id":"a","text":"t"}]}`, "schema version 2"},
		{`{"v":1,"chunk":0,"items":[{"id":"a","text":"t"}]}`, "empty job_id"},
		{`{"v":1,"job_id":"j","chunk":-1,"items":[{"id":"a","text":"t"}]}`, "negative chunk"},
		{`{"v":1,"job_id":"j","chunk":3,"chunks":3,"items":[{"id":"a","text":"t"}]}`, "chunk 3 of 3"},
		{`{"v":1,"job_id":"j","chunk":0,"items":[]}`, "no items"},
		{`{"v":1,"job_id":"j","chunk":0,"items":[{"id":"","text":"t"}]}`, "empty id"},
		{`{"v":1,"job_id":"j","chunk":0,"items":[{"id":"a","text":"t"},{"id":"a","text":"t"}]}`, `duplicate item id "a"`},
		{`{"v":1,"job_id":"j","chunk":0,"items":[{"id":"a","text":"t"}],"extra":1}`, "unknown field"},
		{`{"v":1,"job_id":"j","chunk":0,"items":[{"id":"a","text":"t"}]} {}`, "trailing data"},
		// Issue 14, items 2 and 10: the id grammar and the content rule.
		{`{"v":1,"job_id":"../x","chunk":0,"items":[{"id":"a","text":"t"}]}`, "job_id: id has characters outside its grammar"},
		{`{"v":1,"job_id":"a\u0001b","chunk":0,"items":[{"id":"a","text":"t"}]}`, "job_id: id has characters"},
		{`{"v":1,"job_id":"` + strings.Repeat("a", 65) + `","chunk":0,"items":[{"id":"a","text":"t"}]}`, "job_id: id too long"},
		{`{"v":1,"job_id":"j","chunk":0,"items":[{"id":"` + strings.Repeat("i", 257) + `","text":"t"}]}`, "item id: id too long"},
		{`{"v":1,"job_id":"j","chunk":0,"items":[{"id":"a\nb","text":"t"}]}`, "item id: id has characters"},
		{`{"v":1,"job_id":"j","chunk":0,"items":[{"id":"a"}]}`, `item "a": item has neither text nor data`},
		{`{"v":1,"job_id":"j","chunk":0,"items":[{"id":"a","text":"","data":""}]}`, "neither text nor data"},
	} {
		_, err := DecodeWork([]byte(tc.body))
		if !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("DecodeWork(%s) = %v; want ErrMalformed mentioning %q", tc.body, err, tc.want)
		}
	}
}

// The result schema is a contract with consumers: its field names must not
// drift.
func TestResultSchema(t *testing.T) {
	r := Result{V: Version, JobID: "j", Chunk: 1, Model: "m", Attempt: 2, WorkerMS: 5,
		Outputs: []Output{{ID: "a", Embedding: []float32{0.5, -1}}}}
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	const want = `{"v":1,"job_id":"j","chunk":1,"model":"m","outputs":[{"id":"a","embedding":[0.5,-1]}],"attempt":2,"worker_ms":5}`
	if string(b) != want {
		t.Errorf("result JSON\n got %s\nwant %s", b, want)
	}
	if got := Attributes(r.Key()); got[AttrJobID] != "j" || got[AttrChunk] != "1" {
		t.Errorf("Attributes = %v", got)
	}
}

// The id grammar of issue 14, item 2, case by case: what the publisher mints
// and what tests and loadgen use passes; path tricks, control characters,
// separators and long ids do not.
func TestIDGrammar(t *testing.T) {
	for _, tc := range []struct {
		id   string
		want error
	}{
		{"0123456789abcdef0123456789abcdef", nil},
		{"loadgen-20261124T060000-3", nil},
		{"J_1", nil},
		{strings.Repeat("a", MaxJobIDBytes), nil},
		{"", ErrEmptyID},
		{strings.Repeat("a", MaxJobIDBytes+1), ErrIDTooLong},
		{"../other", ErrIDChars},
		{"a/b", ErrIDChars},
		{"a.b", ErrIDChars},
		{"a b", ErrIDChars},
		{"a\x00b", ErrIDChars},
		{"é", ErrIDChars},
	} {
		if err := CheckJobID(tc.id); !errors.Is(err, tc.want) || (tc.want == nil) != (err == nil) {
			t.Errorf("CheckJobID(%q) = %v; want %v", tc.id, err, tc.want)
		}
		if err := CheckJobID(tc.id); err != nil && strings.Contains(err.Error(), tc.id) && tc.id != "" {
			t.Errorf("CheckJobID(%q) quotes the id: %v", tc.id, err)
		}
	}
	for _, tc := range []struct {
		id   string
		want error
	}{
		{"a", nil},
		{"émoji 😀 \uFFFE\uFFFF", nil}, // allowed, and escaped on the way out
		{strings.Repeat("é", MaxItemIDBytes/2), nil},
		{"", ErrEmptyID},
		{strings.Repeat("a", MaxItemIDBytes+1), ErrIDTooLong},
		{"a\nb", ErrIDChars},
		{"a\x7fb", ErrIDChars},
		{"a\u0085b", ErrIDChars},
		{"a\xffb", ErrIDChars},
	} {
		if err := CheckItemID(tc.id); !errors.Is(err, tc.want) || (tc.want == nil) != (err == nil) {
			t.Errorf("CheckItemID(%q) = %v; want %v", tc.id, err, tc.want)
		}
	}
}

// Issue 14, item 10: one rule for an item's content, on both sides.
func TestItemCheck(t *testing.T) {
	ref := &PayloadRef{Bucket: "b", Key: "k", Size: 1, SHA256: strings.Repeat("0", 64)}
	for _, tc := range []struct {
		it   Item
		want error
	}{
		{Item{ID: "a", Text: "t"}, nil},
		{Item{ID: "a", Data: []byte{0}}, nil},
		{Item{ID: "a", Ref: ref}, nil},
		{Item{ID: "a"}, ErrEmptyItem},
		{Item{ID: "a", Data: []byte{}}, ErrEmptyItem},
		{Item{ID: "a", Text: "t", Ref: ref}, ErrMixedItem},
		{Item{ID: "", Text: "t"}, ErrEmptyID},
	} {
		err := tc.it.Check()
		if !errors.Is(err, tc.want) || (tc.want == nil) != (err == nil) || (err != nil && !errors.Is(err, ErrMalformed)) {
			t.Errorf("%+v.Check() = %v; want %v wrapped with ErrMalformed", tc.it, err, tc.want)
		}
	}
}

// MaxItems bounds a message whoever sent it (issue 14, item 4).
func TestDecodeWorkBoundsItems(t *testing.T) {
	w := Work{V: Version, JobID: "j", Items: make([]Item, MaxItems+1)}
	for i := range w.Items {
		w.Items[i] = Item{ID: strconv.Itoa(i), Text: "t"}
	}
	b, _ := json.Marshal(w)
	if _, err := DecodeWork(b); !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), "at most 1000") {
		t.Errorf("DecodeWork of %d items = %v; want malformed", len(w.Items), err)
	}
	w.Items = w.Items[:MaxItems]
	b, _ = json.Marshal(w)
	if _, err := DecodeWork(b); err != nil {
		t.Errorf("DecodeWork of %d items = %v", len(w.Items), err)
	}
}

// EncodeForSQS leaves nothing SQS (or fauxqs) refuses in a body, and the
// JSON decodes to the same value (issue 14, item 3).
func TestEncodeForSQS(t *testing.T) {
	r := Result{V: Version, JobID: "j", Outputs: []Output{{ID: "😀 \uFFFE \uFFFF é \u0001"}}}
	raw, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	if sqsRefused.Find(raw) == nil {
		t.Fatalf("test input %s needs no escaping", raw)
	}
	esc := EncodeForSQS(raw)
	if bad := sqsRefused.Find(esc); bad != nil {
		t.Errorf("EncodeForSQS left %q in %s", bad, esc)
	}
	var back Result
	if err := json.Unmarshal(esc, &back); err != nil || back.Outputs[0].ID != r.Outputs[0].ID {
		t.Errorf("escaped result decodes to %+v, %v; want id %q", back, err, r.Outputs[0].ID)
	}
	if plain := []byte(`{"id":"é"}`); &EncodeForSQS(plain)[0] != &plain[0] {
		t.Error("EncodeForSQS copied a body that needed no escaping")
	}
}

func TestAttributeSafe(t *testing.T) {
	for in, want := range map[string]string{
		"plain é 中":          "plain é 中",
		"tab\tnl\n":          "tab\tnl\n",
		"a\x01b":             `a\x01b`,
		"\uFFFE\uFFFF":       `\ufffe\uffff`,
		"😀":                  `\U0001f600`,
		"bad\xffutf8":        `bad\xffutf8`,
		`item "a\u0001"`:     `item "a\u0001"`,
		"\"\x00\" quoted id": `"\x00" quoted id`,
	} {
		got := AttributeSafe(in)
		if got != want {
			t.Errorf("AttributeSafe(%q) = %q; want %q", in, got, want)
		}
		if sqsRefused.MatchString(got) {
			t.Errorf("AttributeSafe(%q) = %q still has a refused character", in, got)
		}
	}
}

// MessageSize counts what SQS's SendMessage documentation says counts
// towards the limit: the body, and each attribute's name, type and value.
func TestMessageSize(t *testing.T) {
	attrs := map[string]string{AttrJobID: "jj", AttrChunk: "12"}
	want := len("body") + len(AttrJobID) + len("String") + 2 + len(AttrChunk) + len("String") + 2
	if got := MessageSize("body", attrs); got != want {
		t.Errorf("MessageSize = %d; want %d", got, want)
	}
	if got := MessageSize("é", nil); got != 2 {
		t.Errorf("MessageSize(é) = %d; want 2 (UTF-8 bytes)", got)
	}
}

// Issue 20, item 3: an item error's message is the model's words, which may
// quote what the sender chose: escaped like a DLQ reason and cut on a
// character boundary.
func TestNewItemErrorEscapesAndCuts(t *testing.T) {
	e := NewItemError(ItemInvalidInput, "bad \x00 item \uffff")
	if e.Code != ItemInvalidInput || e.Message != `bad \x00 item \uffff` {
		t.Errorf("got %+v", e)
	}
	long := NewItemError(ItemInvalidInput, strings.Repeat("é", MaxItemErrorLen)) // 2 bytes each
	if len(long.Message) != MaxItemErrorLen || !utf8.ValidString(long.Message) {
		t.Errorf("cut to %d bytes (valid %v), want %d", len(long.Message), utf8.ValidString(long.Message), MaxItemErrorLen)
	}
	odd := NewItemError(ItemInvalidInput, "x"+strings.Repeat("é", MaxItemErrorLen))
	if len(odd.Message) != MaxItemErrorLen-1 || !utf8.ValidString(odd.Message) {
		t.Errorf("cut to %d bytes (valid %v), want %d", len(odd.Message), utf8.ValidString(odd.Message), MaxItemErrorLen-1)
	}
}

func TestBatchOf(t *testing.T) {
	for id, want := range map[string]string{
		"batch_0193a1b2c3d4e5f60718293a4b5c6d7e": "batch_0193a1b2c3d4e5f60718293a4b5c6d7e",
		"0123456789abcdef0123456789abcdef":       "",
		"batch_":                                 "",
		"mybatch_1":                              "",
	} {
		if got := BatchOf(id); got != want {
			t.Errorf("BatchOf(%q) = %q; want %q", id, got, want)
		}
	}
}
