package job

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

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
		{`{"v":2,"job_id":"j","chunk":0,"items":[{"id":"a"}]}`, "schema version 2"},
		{`{"v":1,"chunk":0,"items":[{"id":"a"}]}`, "empty job_id"},
		{`{"v":1,"job_id":"j","chunk":-1,"items":[{"id":"a"}]}`, "negative chunk"},
		{`{"v":1,"job_id":"j","chunk":3,"chunks":3,"items":[{"id":"a"}]}`, "chunk 3 of 3"},
		{`{"v":1,"job_id":"j","chunk":0,"items":[]}`, "no items"},
		{`{"v":1,"job_id":"j","chunk":0,"items":[{"id":""}]}`, "empty id"},
		{`{"v":1,"job_id":"j","chunk":0,"items":[{"id":"a"},{"id":"a"}]}`, `duplicate item id "a"`},
		{`{"v":1,"job_id":"j","chunk":0,"items":[{"id":"a"}],"extra":1}`, "unknown field"},
		{`{"v":1,"job_id":"j","chunk":0,"items":[{"id":"a"}]} {}`, "trailing data"},
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
