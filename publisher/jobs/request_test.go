package jobs

import (
	"net/http"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/publisher/api"
)

var testLimits = RequestLimits{MaxItems: 5, MaxChunkItems: 100}

func TestDecodeJobRequest(t *testing.T) {
	long := strings.Repeat("x", MaxItemIDBytes+1)
	for _, tc := range []struct {
		name   string
		body   string
		status int
		code   string
		item   string
	}{
		{"empty body", "", 400, api.CodeMalformedJSON, ""},
		{"whitespace body", " \n ", 400, api.CodeMalformedJSON, ""},
		{"syntax", `{"items":[`, 400, api.CodeMalformedJSON, ""},
		{"not an object", `[1,2]`, 400, api.CodeMalformedJSON, ""},
		{"wrong type", `{"items":"a"}`, 400, api.CodeMalformedJSON, ""},
		{"unknown field", `{"items":[{"id":"a","text":"x"}],"priority":1}`, 400, api.CodeUnknownField, ""},
		{"unknown item field", `{"items":[{"id":"a","text":"x","ref":{}}]}`, 400, api.CodeUnknownField, ""},
		{"trailing object", `{"items":[{"id":"a","text":"x"}]}{}`, 400, api.CodeMalformedJSON, ""},
		{"trailing garbage", `{"items":[{"id":"a","text":"x"}]} x`, 400, api.CodeMalformedJSON, ""},
		{"bad base64", `{"items":[{"id":"a","data":"!!"}]}`, 400, api.CodeMalformedJSON, ""},
		{"null", `null`, 422, api.CodeNoItems, ""},
		{"no items", `{"items":[]}`, 422, api.CodeNoItems, ""},
		{"items missing", `{}`, 422, api.CodeNoItems, ""},
		{"too many", `{"items":[{"id":"1","text":"x"},{"id":"2","text":"x"},{"id":"3","text":"x"},{"id":"4","text":"x"},{"id":"5","text":"x"},{"id":"6","text":"x"}]}`, 422, api.CodeTooManyItems, ""},
		{"missing id", `{"items":[{"text":"x"}]}`, 422, api.CodeMissingItemID, ""},
		{"empty id", `{"items":[{"id":"","text":"x"}]}`, 422, api.CodeMissingItemID, ""},
		{"long id", `{"items":[{"id":"` + long + `","text":"x"}]}`, 422, api.CodeItemIDTooLong, ""},
		{"empty item", `{"items":[{"id":"a"}]}`, 422, api.CodeEmptyItem, "a"},
		{"empty data", `{"items":[{"id":"a","data":""}]}`, 422, api.CodeEmptyItem, "a"},
		// The subscriber's rule (job.CheckItemID): nothing accepted here is
		// dead-lettered there (issue 14, item 2).
		{"control character in id", `{"items":[{"id":"a\u0007b","text":"x"}]}`, 422, CodeInvalidItemID, ""},
		{"duplicate", `{"items":[{"id":"a","text":"x"},{"id":"a","text":"y"}]}`, 422, api.CodeDuplicateItemID, "a"},
		{"chunk_items negative", `{"items":[{"id":"a","text":"x"}],"options":{"chunk_items":-1}}`, 422, api.CodeInvalidOptions, ""},
		{"chunk_items over cap", `{"items":[{"id":"a","text":"x"}],"options":{"chunk_items":101}}`, 422, api.CodeInvalidOptions, ""},
		{"chunk_items fraction", `{"items":[{"id":"a","text":"x"}],"options":{"chunk_items":1.5}}`, 400, api.CodeMalformedJSON, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, e := DecodeJobRequest([]byte(tc.body), testLimits)
			if e == nil {
				t.Fatalf("accepted %s", tc.body)
			}
			if e.Status != tc.status || e.Code != tc.code || e.Item != tc.item {
				t.Errorf("got %d %s item %q (%s), want %d %s item %q", e.Status, e.Code, e.Item, e.Message, tc.status, tc.code, tc.item)
			}
		})
	}
}

func TestDecodeJobRequestValid(t *testing.T) {
	body := `{"items":[{"id":"a","text":"hello"},{"id":"b","data":"AAEC"},{"id":"c","text":"t","data":"AA=="}],"options":{"chunk_items":2}}`
	req, e := DecodeJobRequest([]byte(body), testLimits)
	if e != nil {
		t.Fatal(e)
	}
	want := &JobRequest{Items: []RequestItem{{ID: "a", Text: "hello"}, {ID: "b", Data: []byte{0, 1, 2}},
		{ID: "c", Text: "t", Data: []byte{0}}},
		Options: &JobOptions{ChunkItems: 2}}
	if diff := cmp.Diff(want, req); diff != "" {
		t.Errorf("decoded (-want +got):\n%s", diff)
	}
	if got := req.chunkItems(32); got != 2 {
		t.Errorf("chunk items %d, want 2", got)
	}
	if got := (&JobRequest{}).chunkItems(32); got != 32 {
		t.Errorf("default chunk items %d, want 32", got)
	}
}

func TestCheckContentType(t *testing.T) {
	for ct, ok := range map[string]bool{
		"application/json":                  true,
		"application/json; charset=utf-8":   true,
		"Application/JSON; charset=UTF-8":   true,
		"":                                  false,
		"text/plain":                        false,
		"application/json; charset=latin1":  false,
		"application/x-www-form-urlencoded": false,
		"application/json;;":                false,
	} {
		var cts []string
		if ct != "" {
			cts = []string{ct}
		}
		if e := api.CheckContentType(cts); (e == nil) != ok {
			t.Errorf("%q: got %v, want ok=%v", ct, e, ok)
		} else if e != nil && e.Status != http.StatusUnsupportedMediaType {
			t.Errorf("%q: status %d", ct, e.Status)
		}
	}
	// Two headers, even two good ones: a proxy in front may have read the
	// other one.
	for _, cts := range [][]string{{"application/json", "application/json"}, {"application/json", "text/plain"}} {
		if e := api.CheckContentType(cts); e == nil || e.Status != http.StatusUnsupportedMediaType {
			t.Errorf("%q: got %v, want 415", cts, e)
		}
	}
}

func TestIdempotencyKeyValid(t *testing.T) {
	for k, ok := range map[string]bool{
		"a": true, "550e8400-e29b-41d4-a716-446655440000": true, strings.Repeat("k", 255): true,
		"": false, strings.Repeat("k", 256): false, "has space": false, "tab\t": false, "é": false,
	} {
		if api.ValidIdempotencyKey(k) != ok {
			t.Errorf("%q: want valid=%v", k, ok)
		}
	}
}

// The ids the publisher mints are of the grammar the subscriber checks, and
// so is every id GET /v1/jobs/{id} accepts (issue 14, item 2).
func TestJobIDsAreOfTheGrammar(t *testing.T) {
	for range 100 {
		if id := newJobID(); !validJobID(id) || !job.ValidJobID(id) {
			t.Fatalf("minted %q: publisher's check %v, grammar %v", id, validJobID(id), job.ValidJobID(id))
		}
	}
	for _, id := range []string{"../" + strings.Repeat("0", 29), strings.Repeat("0", 31) + "\x00", strings.Repeat("0", 33), "j"} {
		if validJobID(id) && !job.ValidJobID(id) {
			t.Errorf("GET accepts %q, outside the grammar", id)
		}
	}
}

// A publisher cannot be configured to cut chunks the subscribers refuse
// (job.MaxItems, issue 14, item 4).
func TestMaxChunkItemsBoundedBySubscribers(t *testing.T) {
	c := Config{MaxChunkItems: job.MaxItems + 1}
	if err := validate(c); err == nil || !strings.Contains(err.Error(), "want at most 1000") {
		t.Errorf("Validate with MaxChunkItems %d = %v; want a refusal", c.MaxChunkItems, err)
	}
	c = Config{MaxChunkItems: job.MaxItems}
	if err := validate(c); err != nil && strings.Contains(err.Error(), "max chunk items") {
		t.Errorf("Validate with MaxChunkItems %d = %v", c.MaxChunkItems, err)
	}
}
