package publishertest

import (
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/vramq/vramq/internal/payload"
	"github.com/vramq/vramq/job"
)

// WebhookSecret is a secret as OpenAI's dashboard gives one.
var WebhookSecret = "whsec_" + base64.StdEncoding.EncodeToString([]byte("a secret of thirty-two bytes....."))

// Delivery is one POST a webhook receiver got.
type Delivery struct {
	Header http.Header
	Body   []byte
}

// WebhookReceiver serves a webhook URL that answers each POST with the
// next of statuses (200 once they are used up), and hands each to the
// returned channel.
func WebhookReceiver(t testing.TB, statuses ...int) (string, <-chan Delivery) {
	t.Helper()
	ch := make(chan Delivery, 16)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		ch <- Delivery{r.Header.Clone(), body}
		status := http.StatusOK
		if len(statuses) > 0 {
			status, statuses = statuses[0], statuses[1:]
		}
		w.WriteHeader(status)
	}))
	t.Cleanup(srv.Close)
	return srv.URL, ch
}

// NextDelivery waits for the next delivery.
func NextDelivery(t testing.TB, ch <-chan Delivery) Delivery {
	t.Helper()
	select {
	case d := <-ch:
		return d
	case <-time.After(time.Minute):
		t.Fatal("no webhook delivered within a minute")
		return Delivery{}
	}
}

// PutResults stores in store a result for chunks from..to-1 of a batch of
// EmbeddingLines, one line a chunk, as a subscriber stores one.
func PutResults(t testing.TB, store *payload.Store, batchID string, from, to int) {
	t.Helper()
	body := `{"object":"list","data":[{"object":"embedding","index":0,"embedding":[0.5]}],"model":"ref","usage":{"prompt_tokens":3,"total_tokens":3}}`
	for c := from; c < to; c++ {
		res := fmt.Sprintf(`{"v":1,"job_id":%q,"chunk":%d,"model":"ref","outputs":[{"id":"e-%d","response":{"status_code":200,"body":%s}}],"attempt":1,"worker_ms":1}`,
			batchID, c, c, body)
		if _, err := store.Put(t.Context(), job.ResultKey(batchID, c), []byte(res)); err != nil {
			t.Fatal(err)
		}
	}
}
