package batches

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vramq/vramq/internal/backoff"
)

// A delivery that fails is tried again, the same event under the same
// webhook-id each time, signed anew, until it is answered 2xx: a receiver
// answering 503, then dropping the connection, then 200 gets three POSTs,
// each of which verifies by the Standard Webhooks scheme (verifyWebhook;
// harness/sdkclients verifies deliveries with openai-go's Webhooks.Unwrap);
// and nothing of it waits in
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
	if len(posts) != 3 {
		t.Fatalf("%d posts; want 3", len(posts))
	}
	for i, r := range posts {
		if err := verifyWebhook(secret, r.Header, bodies[r]); err != nil {
			t.Fatalf("post %d: %v", i, err)
		}
		var ev struct {
			Type      string `json:"type"`
			CreatedAt int64  `json:"created_at"`
			Data      struct {
				ID string `json:"id"`
			} `json:"data"`
		}
		if err := json.Unmarshal(bodies[r], &ev); err != nil || ev.Type != "batch.expired" ||
			ev.Data.ID != "batch_0193a1b2c3d4e5f60718293a4b5c6d7e" || ev.CreatedAt != 1_800_000_000 {
			t.Errorf("post %d: %s (%v)", i, bodies[r], err)
		}
		if id := r.Header.Get("webhook-id"); id != posts[0].Header.Get("webhook-id") {
			t.Errorf("post %d has webhook-id %s; the first had %s", i, id, posts[0].Header.Get("webhook-id"))
		}
	}
}

// verifyWebhook checks a delivery as a Standard Webhooks receiver does
// (https://github.com/standard-webhooks/standard-webhooks/blob/main/spec/standard-webhooks.md):
// one of webhook-signature's space-separated "v1,<base64>" is the HMAC-SHA256,
// keyed by the secret's base64 after "whsec_", of webhook-id, "." ,
// webhook-timestamp, ".", body; and the timestamp is within 5 minutes of
// now, the tolerance openai-go's Unwrap keeps.
func verifyWebhook(secret string, h http.Header, body []byte) error {
	key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, "whsec_"))
	if err != nil {
		return err
	}
	id, ts := h.Get("webhook-id"), h.Get("webhook-timestamp")
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil || id == "" {
		return fmt.Errorf("webhook-id %q, webhook-timestamp %q", id, ts)
	}
	if d := time.Since(time.Unix(sec, 0)); d > 5*time.Minute || d < -5*time.Minute {
		return fmt.Errorf("webhook-timestamp %s is %v off", ts, d)
	}
	mac := hmac.New(sha256.New, key)
	fmt.Fprintf(mac, "%s.%s.%s", id, ts, body)
	want := mac.Sum(nil)
	for _, sig := range strings.Fields(h.Get("webhook-signature")) {
		v, b64, ok := strings.Cut(sig, ",")
		got, err := base64.StdEncoding.DecodeString(b64)
		if ok && v == "v1" && err == nil && hmac.Equal(got, want) {
			return nil
		}
	}
	return fmt.Errorf("no v1 signature of webhook-signature %q verifies", h.Get("webhook-signature"))
}
