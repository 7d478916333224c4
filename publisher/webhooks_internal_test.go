package publisher

import (
	"encoding/base64"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/vramq/vramq/internal/backoff"
)

// A delivery that fails is tried again, the same event under the same
// webhook-id each time, signed anew, until it is answered 2xx: a receiver
// answering 503, then dropping the connection, then 200 gets three POSTs,
// each of which openai-go verifies; and nothing of it waits in
// batchEnded, which returns at once.
func TestWebhookRetriedUntilAnswered(t *testing.T) {
	secret := "whsec_" + base64.StdEncoding.EncodeToString([]byte("a secret of thirty-two bytes....."))
	var (
		mu    sync.Mutex
		posts []*http.Request
		tries int
		done  = make(chan struct{})
	)
	bodies := map[*http.Request][]byte{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		defer mu.Unlock()
		tries++
		posts = append(posts, r)
		bodies[r] = body
		switch tries {
		case 1:
			w.WriteHeader(http.StatusServiceUnavailable)
		case 2:
			panic(http.ErrAbortHandler) // the connection dropped
		default:
			close(done)
		}
	}))
	defer srv.Close()
	w, err := newWebhooks(srv.URL, secret, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	w.retry = backoff.Policy{First: time.Millisecond, Max: time.Millisecond}
	w.batchEnded(&batchRecord{ID: "batch_0193a1b2c3d4e5f60718293a4b5c6d7e", Status: batchExpired, EndedAt: 1_800_000_000})
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatal("no delivery answered 200 within a minute")
	}
	mu.Lock()
	defer mu.Unlock()
	sdk := openai.NewClient(option.WithWebhookSecret(secret))
	if len(posts) != 3 {
		t.Fatalf("%d posts; want 3", len(posts))
	}
	for i, r := range posts {
		ev, err := sdk.Webhooks.Unwrap(bodies[r], r.Header)
		if err != nil {
			t.Fatalf("post %d: %v", i, err)
		}
		if x := ev.AsBatchExpired(); x.Type != "batch.expired" || x.Data.ID != "batch_0193a1b2c3d4e5f60718293a4b5c6d7e" || x.CreatedAt != 1_800_000_000 {
			t.Errorf("post %d: %s", i, bodies[r])
		}
		if id := r.Header.Get("webhook-id"); id != posts[0].Header.Get("webhook-id") {
			t.Errorf("post %d has webhook-id %s; the first had %s", i, id, posts[0].Header.Get("webhook-id"))
		}
	}
}
