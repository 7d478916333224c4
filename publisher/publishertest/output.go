package publishertest

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"testing"
)

// OutputLine is a line of a batch's output or error file, as OpenAI's API
// reference gives "the request output object" (openai-go has no type for it).
type OutputLine struct {
	ID       string `json:"id"`
	CustomID string `json:"custom_id"`
	Response *struct {
		StatusCode int             `json:"status_code"`
		RequestID  string          `json:"request_id"`
		Body       json.RawMessage `json:"body"`
	} `json:"response"`
	Error *struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

// OutputLines parses the lines of file id, data.
func OutputLines(t testing.TB, id string, data []byte) []OutputLine {
	t.Helper()
	var out []OutputLine
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var l OutputLine
		// Strict: every key is one the reference names, and both response
		// and error are there (null when empty).
		dec := json.NewDecoder(bytes.NewReader(sc.Bytes()))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&l); err != nil {
			t.Fatalf("line %q of %s: %v", sc.Text(), id, err)
		}
		if !bytes.Contains(sc.Bytes(), []byte(`"response":`)) || !bytes.Contains(sc.Bytes(), []byte(`"error":`)) {
			t.Errorf("line %q of %s lacks response or error", sc.Text(), id)
		}
		out = append(out, l)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// BatchLines is a batch file of n embeddings requests of model "m", whose
// custom_ids are tag-0, tag-1, ...
func BatchLines(n int, tag string) []byte {
	var b bytes.Buffer
	for i := range n {
		fmt.Fprintf(&b, `{"custom_id":"%s-%d","method":"POST","url":"/v1/embeddings","body":{"model":"m","input":"x"}}`+"\n", tag, i)
	}
	return b.Bytes()
}

// EmbeddingLines is a batch file of n embeddings requests of the reference
// model ("ref", RefModel), whose custom_ids are e-0, e-1, ...
func EmbeddingLines(n int) []byte {
	var b bytes.Buffer
	for i := range n {
		fmt.Fprintf(&b, `{"custom_id":"e-%d","method":"POST","url":"/v1/embeddings","body":{"model":"ref","input":"the %d th text to embed"}}`+"\n", i, i)
	}
	return b.Bytes()
}
