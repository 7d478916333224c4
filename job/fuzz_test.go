package job

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"regexp"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

// FuzzDecodeWork feeds arbitrary bodies to the work message decoder. The seed
// corpus is in testdata/fuzz/FuzzDecodeWork; go test runs it. Invariants:
//   - a refusal wraps ErrMalformed (it goes to the dead-letter queue);
//   - an accepted message passes Validate, has a job id of the grammar
//     (restated here as a regexp), at most MaxItems items, unique non-empty
//     item ids without control characters, and every item has either inline
//     content or a valid Ref, never both;
//   - its endpoint is empty or one of the three, and inline content is a
//     JSON object in body exactly when there is one (text or data when not);
//   - it survives json.Marshal (plain, and escaped by EncodeForSQS, which
//     leaves nothing SQS refuses) and DecodeWork again unchanged (a body
//     as the same JSON value: marshalling compacts it, and the escapes
//     write some characters another way).
func FuzzDecodeWork(f *testing.F) {
	f.Add([]byte(`{"v":1,"job_id":"j","chunk":0,"items":[{"id":"a","text":"hello"}]}`))
	f.Add([]byte(`{"v":1,"job_id":"j","chunk":0,"endpoint":"/v1/embeddings","items":[{"id":"a","body":{"model":"m","input":"x"}}]}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		w, err := DecodeWork(body)
		if err != nil {
			if w != nil {
				t.Fatalf("DecodeWork returned both %+v and %v", w, err)
			}
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("refusal does not wrap ErrMalformed: %v", err)
			}
			return
		}
		if w == nil {
			t.Fatal("DecodeWork returned neither a message nor an error")
		}
		if err := w.Validate(); err != nil {
			t.Fatalf("accepted message fails Validate: %v", err)
		}
		if !jobIDGrammar.MatchString(w.JobID) || len(w.Items) > MaxItems {
			t.Fatalf("accepted job id %q with %d items", w.JobID, len(w.Items))
		}
		if w.V != Version || w.JobID == "" || w.Chunk < 0 || (w.Chunks != 0 && w.Chunk >= w.Chunks) || len(w.Items) == 0 {
			t.Fatalf("accepted header v=%d job_id=%q chunk=%d chunks=%d items=%d", w.V, w.JobID, w.Chunk, w.Chunks, len(w.Items))
		}
		if w.Endpoint != "" && w.Endpoint != "/v1/chat/completions" && w.Endpoint != "/v1/completions" && w.Endpoint != "/v1/embeddings" {
			t.Fatalf("accepted endpoint %q", w.Endpoint)
		}
		seen := map[string]bool{}
		for i, it := range w.Items {
			if it.ID == "" || seen[it.ID] {
				t.Fatalf("item %d: accepted id %q (empty or duplicate)", i, it.ID)
			}
			seen[it.ID] = true
			if len(it.ID) > MaxItemIDBytes || controlChar.MatchString(it.ID) {
				t.Fatalf("item %d: accepted id %q", i, it.ID)
			}
			text, body := it.Text != "" || len(it.Data) > 0, len(it.Body) > 0
			switch {
			case w.Endpoint == "" && body:
				t.Fatalf("item %q: accepted a body without an endpoint", it.ID)
			case w.Endpoint != "" && text:
				t.Fatalf("item %q: accepted text or data with an endpoint", it.ID)
			case it.Ref == nil && !text && !body:
				t.Fatalf("item %q: accepted without content", it.ID)
			case body && !isObject(it.Body):
				t.Fatalf("item %q: accepted body %s, not a JSON object", it.ID, it.Body)
			}
			if it.Ref != nil {
				if text || body {
					t.Fatalf("item %q: accepted a ref with inline content", it.ID)
				}
				if !validRef(it.Ref) {
					t.Fatalf("item %q: accepted ref %+v", it.ID, *it.Ref)
				}
			}
		}
		enc, err := json.Marshal(w)
		if err != nil {
			t.Fatalf("marshal accepted message: %v", err)
		}
		esc := EncodeForSQS(enc)
		if bad := sqsRefused.Find(esc); bad != nil {
			t.Fatalf("EncodeForSQS left %q in %s", bad, esc)
		}
		again, err := DecodeWork(esc)
		if err != nil {
			t.Fatalf("re-encoded message refused: %v\n%s", err, enc)
		}
		// "data":"" decodes to an empty, non-nil slice that omitempty drops.
		if d := cmp.Diff(w, again, cmpopts.EquateEmpty(), jsonValue); d != "" {
			t.Fatalf("round trip changed the message (-first +second):\n%s", d)
		}
	})
}

var (
	sha256Hex    = regexp.MustCompile(`^[0-9a-f]{64}$`)
	jobIDGrammar = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)
	controlChar  = regexp.MustCompile(`\p{Cc}`)
	// sqsRefused is what SQS (or the fauxqs emulator, above U+FFFF) refuses
	// in a body, per the SendMessage documentation's character list.
	sqsRefused = regexp.MustCompile(`[^\x{9}\x{A}\x{D}\x{20}-\x{D7FF}\x{E000}-\x{FFFD}]`)
)

// jsonValue compares raw JSON (and only that: not the []byte of Data) by
// the value it holds, where either side has one (EquateEmpty has the rest).
var jsonValue = cmp.FilterPath(func(p cmp.Path) bool { return p.Last().Type() == reflect.TypeFor[json.RawMessage]() },
	cmp.FilterValues(func(a, b json.RawMessage) bool { return len(a) > 0 || len(b) > 0 },
		cmp.Transformer("jsonValue", func(m json.RawMessage) any {
			var v any
			if err := json.Unmarshal(m, &v); err != nil {
				return err.Error()
			}
			return v
		})))

// isObject is the body rule, restated independently: one JSON object.
func isObject(b []byte) bool {
	var m map[string]json.RawMessage
	return json.Unmarshal(b, &m) == nil && m != nil
}

// validRef is PayloadRef.Validate's rule, restated independently.
func validRef(r *PayloadRef) bool {
	return r.Bucket != "" && r.Key != "" && r.Size >= 0 && sha256Hex.MatchString(r.SHA256)
}

// FuzzPayloadRef decodes arbitrary JSON as a claim-check reference and checks
// Validate against an independent statement of its rule, then checks that
// DecodeWork treats the same reference inside a work message the same way.
// The seed corpus is in testdata/fuzz/FuzzPayloadRef. Invariants:
//   - Validate accepts exactly the refs with a non-empty bucket and key, a
//     size >= 0 and a sha256 of 64 lower-case hex digits;
//   - its refusals wrap ErrMalformed;
//   - an accepted ref survives json.Marshal and decoding unchanged;
//   - in a work message, the ref is accepted (and decoded to the same value)
//     exactly when it is accepted on its own; otherwise the message is
//     refused with ErrMalformed.
func FuzzPayloadRef(f *testing.F) {
	f.Add([]byte(`{"bucket":"b","key":"k","size":1,"sha256":"` + zeroSHA + `"}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		if !json.Valid(data) {
			return // not JSON: the JSON decoder's business, covered by FuzzDecodeWork
		}
		var r PayloadRef
		dec := json.NewDecoder(bytes.NewReader(data))
		dec.DisallowUnknownFields()
		decErr := dec.Decode(&r)
		var vErr error
		if decErr == nil {
			vErr = r.Validate()
			if want := validRef(&r); want != (vErr == nil) {
				t.Fatalf("Validate(%+v) = %v, want valid=%v", r, vErr, want)
			}
			if vErr != nil && !errors.Is(vErr, ErrMalformed) {
				t.Fatalf("refusal does not wrap ErrMalformed: %v", vErr)
			}
			if vErr == nil {
				enc, err := json.Marshal(&r)
				if err != nil {
					t.Fatal(err)
				}
				var again PayloadRef
				if err := json.Unmarshal(enc, &again); err != nil {
					t.Fatalf("re-encoded ref: %v\n%s", err, enc)
				}
				if again != r {
					t.Fatalf("round trip changed the ref: %+v, then %+v", r, again)
				}
			}
		}

		if string(bytes.TrimSpace(data)) == "null" {
			return // "ref":null means no ref at all
		}
		body := append([]byte(`{"v":1,"job_id":"j","chunk":0,"items":[{"id":"a","ref":`), data...)
		body = append(body, "}]}"...)
		w, err := DecodeWork(body)
		if decErr == nil && vErr == nil {
			if err != nil {
				t.Fatalf("valid ref %+v refused in a work message: %v", r, err)
			}
			if got := w.Items[0].Ref; got == nil || *got != r {
				t.Fatalf("ref in a work message decoded to %+v, want %+v", got, r)
			}
			return
		}
		if err == nil {
			t.Fatalf("work message with an invalid ref accepted: %+v (alone: %v, %v)", *w.Items[0].Ref, decErr, vErr)
		}
		if !errors.Is(err, ErrMalformed) {
			t.Fatalf("refusal does not wrap ErrMalformed: %v", err)
		}
	})
}

const zeroSHA = "0000000000000000000000000000000000000000000000000000000000000000"
