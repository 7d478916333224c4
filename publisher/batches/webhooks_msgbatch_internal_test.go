package batches

import (
	"encoding/base64"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
)

// OpenAI's batch events are sent for OpenAI's batches only: a Message
// Batch's end takes no delivery slot (the slot is taken before batchEnded
// returns, so its count says whether a delivery began), an OpenAI batch's
// does.
func TestWebhookNotSentForMessageBatches(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { <-release }))
	defer srv.Close()
	defer close(release)
	w, err := newWebhooks(srv.URL, "whsec_"+base64.StdEncoding.EncodeToString([]byte("a secret of thirty-two bytes.....")),
		slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	w.batchEnded(&batchRecord{ID: "msgbatch_0193a1b2c3d4e5f60718293a4b5c6d7e", Status: batchCompleted, EndedAt: 1_800_000_000})
	if n := len(w.slots); n != 0 {
		t.Fatalf("a message batch's end began %d deliveries; want none", n)
	}
	w.batchEnded(&batchRecord{ID: "batch_0193a1b2c3d4e5f60718293a4b5c6d7e", Status: batchCompleted, EndedAt: 1_800_000_000})
	if n := len(w.slots); n != 1 {
		t.Fatalf("an OpenAI batch's end began %d deliveries; want 1", n)
	}
}
