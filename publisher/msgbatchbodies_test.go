package publisher_test

import (
	"net/http"
	"testing"

	"github.com/vramq/vramq/publisher"
)

// A Message Batch create is charged to its client's bodies in flight as it
// arrives, as every body is: one larger than the client's share of bytes
// is refused 429 (Anthropic's rate_limit_error), nothing of it created,
// and the charge is given back, so the client's next create within its
// share is taken.
func TestMessageBatchCreateChargedToTheClientsBodies(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true)
	s := e.serveUnswept(publisher.Config{
		MaxFileBytes: 1 << 20,
		API: publisher.API{
			APIKeys:               []string{"acme:key-a"},
			MaxBodyBytes:          4 << 10,
			MaxBodyBytesPerClient: 4 << 10,
			MaxBodyBytesInFlight:  1 << 20,
		},
	})
	a := anthropicClient{s, "key-a"}
	big := createBody(60, question) // about 9 KiB: past the client's share of 4 KiB
	if len(big) <= 4<<10 {
		t.Fatalf("the create is %d bytes; want it past 4 KiB", len(big))
	}
	wantAnthropicError(t, "a create past the client's share", a.do(http.MethodPost, "/v1/messages/batches", big), 429, "rate_limit_error")
	if q := e.queued(); q != 0 {
		t.Errorf("%d messages queued by a refused create", q)
	}
	if r := a.do(http.MethodPost, "/v1/messages/batches", createBody(2, question)); r.status != http.StatusOK {
		t.Errorf("a create within the share after the refusal: %d %s", r.status, r.body)
	}
}
