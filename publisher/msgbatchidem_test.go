package publisher_test

import (
	"net/http"
	"testing"

	"github.com/vramq/vramq/publisher"
)

// A Message Batch create with an Idempotency-Key, retried after its answer
// was lost, gets the same answer and makes no second batch; the same key
// with another body is refused 422, and another tenant's same key is its
// own.
func TestMessageBatchCreateIdempotencyKey(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true)
	s := e.serveUnswept(publisher.Config{API: publisher.API{APIKeys: []string{"acme:key-a", "globex:key-b"}}})
	create := func(key string, n int, idem string) reply {
		return s.do(http.MethodPost, "/v1/messages/batches", map[string]string{"x-api-key": key, "anthropic-version": "2023-06-01",
			"Content-Type": "application/json", "Idempotency-Key": idem}, createBody(n, question))
	}
	first := create("key-a", 3, "create-1")
	if first.status != http.StatusOK {
		t.Fatalf("create: %d %s", first.status, first.body)
	}
	again := create("key-a", 3, "create-1")
	if again.status != http.StatusOK || string(again.body) != string(first.body) || again.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("the retry: %d %s (replayed %q); want the first answer again, %s", again.status, again.body,
			again.header.Get("Idempotent-Replayed"), first.body)
	}
	if other := create("key-a", 4, "create-1"); other.status != http.StatusUnprocessableEntity {
		t.Errorf("the key with another body: %d %s; want 422", other.status, other.body)
	}
	theirs := create("key-b", 3, "create-1")
	if theirs.status != http.StatusOK || theirs.header.Get("Idempotent-Replayed") != "" {
		t.Errorf("another tenant's same key: %d %s; want a batch of its own", theirs.status, theirs.body)
	}
	var list struct{ Data []struct{ ID string } }
	r := anthropicClient{s, "key-a"}.do(http.MethodGet, "/v1/messages/batches", nil)
	r.json(t, &list)
	if len(list.Data) != 1 {
		t.Errorf("%d batches listed after a create and its retry; want 1: %s", len(list.Data), r.body)
	}
	if q := e.queued(); q == 0 {
		t.Errorf("nothing on the queue; want the batches' chunks")
	}
}
