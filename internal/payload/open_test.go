package payload_test

import (
	"errors"
	"io"
	"testing"

	"github.com/vramq/vramq/internal/payload"
	"github.com/vramq/vramq/internal/testenv/sqstest"
)

// Open gives an object's size before any of its body is read, and a missing
// object is ErrMissing, as Read says.
func TestOpen(t *testing.T) {
	c := sqstest.S3(t)
	s := payload.New(c, sqstest.Bucket(t, c))
	if _, err := s.Put(t.Context(), "results/j/0.json", []byte(`{"v":1}`)); err != nil {
		t.Fatal(err)
	}
	body, size, err := s.Open(t.Context(), "results/j/0.json")
	if err != nil {
		t.Fatal(err)
	}
	defer body.Close()
	b, err := io.ReadAll(body)
	if err != nil || size != 7 || string(b) != `{"v":1}` {
		t.Errorf("Open: size %d, body %q, %v", size, b, err)
	}
	if _, _, err := s.Open(t.Context(), "results/j/1.json"); !errors.Is(err, payload.ErrMissing) {
		t.Errorf("Open of a missing object: %v", err)
	}
}
