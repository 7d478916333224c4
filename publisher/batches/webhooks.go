package batches

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/vramq/vramq/internal/backoff"
	"github.com/vramq/vramq/publisher/api"
)

// A batch's end is announced as OpenAI announces it (its webhooks guide,
// "Webhook events": batch.completed, batch.failed, batch.expired,
// batch.cancelled): a POST of
//
//	{"object":"event","id":"evt_…","type":"batch.completed","created_at":1719168000,"data":{"id":"batch_…"}}
//
// to -batch-webhook-url, signed by the Standard Webhooks scheme that
// OpenAI's SDKs verify (standardwebhooks.com, "Signature scheme"): the
// headers webhook-id, webhook-timestamp (Unix seconds) and
// webhook-signature, "v1," then the base64 HMAC-SHA256 of
// "{id}.{timestamp}.{body}" under the secret, which is "whsec_" and the key
// in base64. The event is sent by the owner of the batch's last transition
// (batchstate.go), once per batch but for a crash between the two, and
// from a goroutine of its own: a receiver that is down or slow never holds
// a batch back. A delivery that fails (no answer, or a status other than
// 2xx) is retried with backoff, the same webhook-id each time, so that a
// receiver can drop one it has seen; after webhookTries it is given up and
// logged.

// Webhook delivery bounds.
const (
	webhookTries    = 10               // 15 to 31 minutes of retries at webhookRetry
	webhookTimeout  = 30 * time.Second // an attempt's, answer included
	webhookInFlight = 256              // events being delivered at once; more are dropped, logged
)

// webhookRetry is the wait before each retry: 5 s doubling to 10 minutes,
// jittered so that a receiver back from an outage is not hit by every
// event at once.
var webhookRetry = backoff.Policy{First: 5 * time.Second, Max: 10 * time.Minute, Jitter: backoff.Full / 2}

// webhookEventTypes are the events of a batch's final statuses.
var webhookEventTypes = map[string]string{batchCompleted: "batch.completed", batchFailed: "batch.failed",
	batchExpired: "batch.expired", batchCancelled: "batch.cancelled"}

// webhookEvent is OpenAI's event object for a batch.
type webhookEvent struct {
	Object    string `json:"object"`
	ID        string `json:"id"`
	Type      string `json:"type"`
	CreatedAt int64  `json:"created_at"`
	Data      struct {
		ID string `json:"id"`
	} `json:"data"`
}

// webhooks sends batch events to one URL.
type webhooks struct {
	url    string
	key    []byte // the secret, decoded
	client *http.Client
	retry  backoff.Policy
	slots  chan struct{}
	now    func() time.Time
	log    *slog.Logger
}

// newWebhooks is the sender for url, signing with secret ("whsec_" and
// base64); nil when url is "".
func newWebhooks(url, secret string, log *slog.Logger) (*webhooks, error) {
	if url == "" {
		return nil, nil
	}
	key, err := webhookKey(secret)
	if err != nil {
		return nil, err
	}
	return &webhooks{url: url, key: key, client: &http.Client{Timeout: webhookTimeout}, retry: webhookRetry,
		slots: make(chan struct{}, webhookInFlight), now: time.Now, log: log}, nil
}

// webhookKey decodes a Standard Webhooks secret.
func webhookKey(secret string) ([]byte, error) {
	key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, "whsec_"))
	if err != nil || len(key) < 24 {
		return nil, fmt.Errorf("the webhook secret must be whsec_ and at least 24 bytes in base64 (as OpenAI's dashboard gives one)")
	}
	return key, nil
}

// batchEnded sends b's event, b having just ended, without waiting for it.
func (w *webhooks) batchEnded(b *batchRecord) {
	typ, ok := webhookEventTypes[b.Status]
	// OpenAI's events name OpenAI's batches: a Message Batch has none
	// (Anthropic sends no webhooks for them).
	if w == nil || !ok || isMessageBatch(b) {
		return
	}
	ev := webhookEvent{Object: "event", Type: typ, CreatedAt: max(b.EndedAt, b.FailedAt)}
	// The same id however often it is sent: a receiver deduplicates by it.
	sum := sha256.Sum256([]byte(b.ID + "\x00" + typ))
	ev.ID = "evt_" + hex.EncodeToString(sum[:16])
	ev.Data.ID = b.ID
	select {
	case w.slots <- struct{}{}:
	default:
		w.log.Error("batch webhook dropped: too many being delivered", "batch_id", b.ID, "type", typ)
		return
	}
	go func() {
		defer func() { <-w.slots }()
		w.deliver(context.Background(), &ev)
	}()
}

// deliver sends ev until an attempt is answered 2xx or the tries are spent.
func (w *webhooks) deliver(ctx context.Context, ev *webhookEvent) {
	body := api.EncodeJSON(ev)
	var err error
	for try := 1; try <= webhookTries; try++ {
		if try > 1 {
			if backoff.Sleep(ctx, w.retry.Delay(try-1)) != nil {
				return
			}
		}
		if err = w.post(ctx, ev.ID, body); err == nil {
			return
		}
		w.log.Warn("batch webhook not delivered", "event_id", ev.ID, "batch_id", ev.Data.ID, "try", try, "err", err)
	}
	w.log.Error("batch webhook given up", "event_id", ev.ID, "batch_id", ev.Data.ID, "tries", webhookTries, "err", err)
}

// post makes one attempt, signed at its own time.
func (w *webhooks) post(ctx context.Context, id string, body []byte) error {
	ts := strconv.FormatInt(w.now().Unix(), 10)
	mac := hmac.New(sha256.New, w.key)
	mac.Write([]byte(id + "." + ts + "."))
	mac.Write(body)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, w.url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("webhook-id", id)
	req.Header.Set("webhook-timestamp", ts)
	req.Header.Set("webhook-signature", "v1,"+base64.StdEncoding.EncodeToString(mac.Sum(nil)))
	resp, err := w.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10)) // so the connection is reused
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("answered %s", resp.Status)
	}
	return nil
}
