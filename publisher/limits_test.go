package publisher

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/vramq/vramq/publisher/api"
)

// A body whose Content-Length is over the limit is refused 413 from its
// headers alone: the publisher does not wait for, or read, any of it.
func TestDeclaredOversizeBodyIsRefusedUnread(t *testing.T) {
	srv, q, _ := rateTestServer(t, Config{API: API{MaxBodyBytes: 1 << 10}})
	conn, err := net.Dial("tcp", strings.TrimPrefix(srv.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// Headers only: a server that reads the body before deciding would
	// wait for the 10 MiB this request announces and never send.
	fmt.Fprintf(conn, "POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", 10<<20)
	_ = conn.SetReadDeadline(time.Now().Add(20 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("no answer to headers announcing 10 MiB over a 1 KiB limit: %v", err)
	}
	defer resp.Body.Close()
	var body api.ErrorBody
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil || resp.StatusCode != http.StatusRequestEntityTooLarge || body.Error == nil || body.Error.Code != api.CodeBodyTooLarge {
		t.Errorf("got %d %+v (%v); want 413 %s", resp.StatusCode, body.Error, err, api.CodeBodyTooLarge)
	}
	if n := q.count(); n != 0 {
		t.Errorf("%d messages enqueued", n)
	}
}
