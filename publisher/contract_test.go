package publisher

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/vramq/vramq/publisher/api"
)

// canary marks request content; no error message may carry it back.
const canary = "QZXCANARY"

// errorOf reads a JSON error response, failing the test if it is not one.
func errorOf(t *testing.T, status int, header http.Header, body []byte) *api.Error {
	t.Helper()
	if ct := header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("%d: Content-Type %q, want application/json; body %.200q", status, ct, body)
	}
	var eb api.ErrorBody
	if err := json.Unmarshal(body, &eb); err != nil || eb.Error == nil || eb.Error.Code == "" || eb.Error.Message == "" {
		t.Fatalf("%d %.200q is not a JSON error: %v", status, body, err)
	}
	return eb.Error
}

// Every error answers with fixed text: request content put in the path, the
// query, the headers, field names, item ids and the body's characters never
// comes back in a message (item ids come back in "item" only). Every
// response, error or not, says nosniff.
func TestErrorsEchoNothing(t *testing.T) {
	srv, q, _ := rateTestServer(t, Config{Jobs: Jobs{MaxItems: 3, MaxMessageBytes: 2 << 10}, API: API{MaxBodyBytes: 4 << 10, APIKeys: []string{"the-key"}}})
	const one = `{"items":[{"id":"a","text":"x"}]}`
	big := strings.Repeat(canary, 8<<10/len(canary))
	for _, tc := range []struct {
		name, method, path, body string
		header                   map[string]string
		status                   int
	}{
		{"unknown path", "GET", "/" + canary, "", nil, 404},
		{"status without a bucket", "GET", "/v1/jobs/" + canary, "", nil, 501},
		{"wrong method", "PATCH", "/v1/jobs/" + canary, "", nil, 405},
		{"wrong method on jobs", "PUT", "/v1/jobs?x=" + canary, one, nil, 405},
		{"page size", "GET", "/v1/jobs/0123456789abcdef0123456789abcdef?page_size=" + canary, "", nil, 501},
		{"content type", "POST", "/v1/jobs", one, map[string]string{"Content-Type": "text/" + canary}, 415},
		{"charset", "POST", "/v1/jobs", one, map[string]string{"Content-Type": "application/json; charset=" + canary}, 415},
		{"unknown field", "POST", "/v1/jobs", `{"items":[{"id":"a","text":"x"}],"` + canary + `":1}`, nil, 400},
		{"unknown item field", "POST", "/v1/jobs", `{"items":[{"id":"a","text":"x","` + canary + `":1}]}`, nil, 400},
		{"syntax", "POST", "/v1/jobs", `{"items":` + canary + `}`, nil, 400},
		{"literal", "POST", "/v1/jobs", `{"items":[{"id":"a","text":"x"}],"options":{"chunk_items":t` + canary + `}}`, nil, 400},
		{"wrong type", "POST", "/v1/jobs", `{"items":[{"id":"a","text":{"` + canary + `":1}}]}`, nil, 400},
		{"bad base64", "POST", "/v1/jobs", `{"items":[{"id":"a","data":"` + canary + `!"}]}`, nil, 400},
		{"trailing", "POST", "/v1/jobs", one + canary, nil, 400},
		{"empty item", "POST", "/v1/jobs", `{"items":[{"id":"` + canary + `"}]}`, nil, 422},
		{"duplicate", "POST", "/v1/jobs", `{"items":[{"id":"` + canary + `","text":"x"},{"id":"` + canary + `","text":"x"}]}`, nil, 422},
		{"long id", "POST", "/v1/jobs", `{"items":[{"id":"` + strings.Repeat(canary, 40) + `","text":"x"}]}`, nil, 422},
		{"too many", "POST", "/v1/jobs",
			`{"items":[{"id":"1","text":"x"},{"id":"2","text":"x"},{"id":"3","text":"x"},{"id":"` + canary + `","text":"x"}]}`, nil, 422},
		{"item too large", "POST", "/v1/jobs", `{"items":[{"id":"` + canary + `","text":"` + strings.Repeat("x", 3<<10) + `"}]}`, nil, 413},
		{"body too large", "POST", "/v1/jobs", `{"items":[{"id":"a","text":"` + big + `"}]}`, nil, 413},
		{"idempotency key", "POST", "/v1/jobs", one, map[string]string{"Idempotency-Key": canary + " x"}, 400},
		{"no key", "POST", "/v1/jobs", one, map[string]string{"Authorization": ""}, 401},
		{"wrong key", "POST", "/v1/jobs", one, map[string]string{"Authorization": "Bearer " + canary}, 401},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, err := http.NewRequestWithContext(t.Context(), tc.method, srv.URL+tc.path, strings.NewReader(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Authorization", "Bearer the-key")
			for k, v := range tc.header {
				if v == "" {
					req.Header.Del(k)
				} else {
					req.Header.Set(k, v)
				}
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != tc.status {
				t.Errorf("status %d, want %d: %s", resp.StatusCode, tc.status, body)
			}
			e := errorOf(t, resp.StatusCode, resp.Header, body)
			if strings.Contains(strings.ToUpper(e.Message), "QZX") || strings.Contains(e.Message, "'Q'") {
				t.Errorf("the message quotes the request: %q", e.Message)
			}
			if e.Item != "" && e.Item != canary {
				t.Errorf("item %q", e.Item)
			}
			if got := resp.Header.Get("X-Content-Type-Options"); got != "nosniff" {
				t.Errorf("X-Content-Type-Options %q", got)
			}
		})
	}
	if n := q.count(); n != 0 {
		t.Errorf("%d messages enqueued", n)
	}
	// Success and probes say nosniff too.
	for _, r := range []*http.Response{send(t, "POST", srv.URL+"/v1/jobs", "the-key", one), send(t, "GET", srv.URL+"/healthz", "", "")} {
		if r.StatusCode >= 300 || r.Header.Get("X-Content-Type-Options") != "nosniff" {
			t.Errorf("%s: %d, X-Content-Type-Options %q", r.Request.URL.Path, r.StatusCode, r.Header.Get("X-Content-Type-Options"))
		}
	}
}

// Invalid UTF-8 is refused, not decoded to U+FFFD: the job would run on ids
// and text the client never sent. Nothing is enqueued.
func TestInvalidUTF8IsRefused(t *testing.T) {
	srv, q, _ := rateTestServer(t, Config{})
	for name, body := range map[string]string{
		"in an id":         "{\"items\":[{\"id\":\"a\xff\",\"text\":\"x\"}]}",
		"in a text":        "{\"items\":[{\"id\":\"a\",\"text\":\"x\xc3\"}]}",
		"surrogate half":   "{\"items\":[{\"id\":\"a\",\"text\":\"\xed\xa0\x80\"}]}",
		"overlong slash":   "{\"items\":[{\"id\":\"a\xc0\xaf\",\"text\":\"x\"}]}",
		"outside a string": "{\"items\":[{\"id\":\"a\",\"text\":\"x\"}]}\xff",
	} {
		t.Run(name, func(t *testing.T) {
			resp := send(t, "POST", srv.URL+"/v1/jobs", "", body)
			b, _ := io.ReadAll(resp.Body)
			if e := errorOf(t, resp.StatusCode, resp.Header, b); resp.StatusCode != http.StatusBadRequest || e.Code != api.CodeMalformedJSON {
				t.Errorf("%d %s, want 400 %s", resp.StatusCode, e.Code, api.CodeMalformedJSON)
			}
		})
	}
	// Escapes are JSON's own business: a valid \u escape of a character
	// outside the BMP is taken.
	if resp := send(t, "POST", srv.URL+"/v1/jobs", "", `{"items":[{"id":"a","text":"\ud83d\ude00 é"}]}`); resp.StatusCode != http.StatusAccepted {
		t.Errorf("valid UTF-8 and escapes: %d", resp.StatusCode)
	}
	if n := q.count(); n != 1 {
		t.Errorf("%d messages enqueued, want 1 (the valid job's)", n)
	}
}

// Two Content-Type headers are refused, even two that agree: a proxy in
// front may have believed the one the publisher did not.
func TestDuplicateContentTypeIsRefused(t *testing.T) {
	srv, q, _ := rateTestServer(t, Config{})
	for _, cts := range [][]string{{"application/json", "text/plain"}, {"text/plain", "application/json"},
		{"application/json", "application/json"}} {
		req, _ := http.NewRequestWithContext(t.Context(), "POST", srv.URL+"/v1/jobs", strings.NewReader(`{"items":[{"id":"a","text":"x"}]}`))
		req.Header["Content-Type"] = cts
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if e := errorOf(t, resp.StatusCode, resp.Header, b); resp.StatusCode != http.StatusUnsupportedMediaType || e.Code != api.CodeUnsupportedMedia {
			t.Errorf("%q: %d %s, want 415 %s", cts, resp.StatusCode, e.Code, api.CodeUnsupportedMedia)
		}
	}
	if n := q.count(); n != 0 {
		t.Errorf("%d messages enqueued", n)
	}
}

// rawRequest writes req to the server as is and reads one response.
func rawRequest(t *testing.T, addr, req string) (*http.Response, []byte) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := io.WriteString(conn, req); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("%.80q: no response: %v", req, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp, body
}

// A path that is not in canonical form is a JSON 404, never the mux's HTML
// redirect to the cleaned path, whatever the route it would clean to.
func TestUncleanPathsAreJSON(t *testing.T) {
	srv, _, _ := rateTestServer(t, Config{})
	addr := strings.TrimPrefix(srv.URL, "http://")
	for _, path := range []string{
		"/v1/jobs/../jobs/0123456789abcdef0123456789abcdef", "/v1/../healthz", "/a/../v1/jobs", "/v1/jobs/./x",
		"//v1/jobs", "/v1//jobs", "/v1/jobs/", "/..", "/./", "/v1/jobs/..%2f..%2fhealthz", "*",
	} {
		for _, method := range []string{"GET", "POST"} {
			resp, body := rawRequest(t, addr, method+" "+path+" HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 0\r\n\r\n")
			if resp.StatusCode < 400 || resp.StatusCode >= 500 {
				t.Errorf("%s %s: %d %q, want a 4xx", method, path, resp.StatusCode, body)
				continue
			}
			if e := errorOf(t, resp.StatusCode, resp.Header, body); resp.StatusCode == 404 && e.Code != api.CodeNotFound {
				t.Errorf("%s %s: code %s", method, path, e.Code)
			}
		}
	}
}

// The answers net/http's server writes itself, before any handler (431 for
// headers over MaxHeaderBytes, 400 for what is not HTTP, 501 for an unknown
// transfer coding, 505 for an unknown version, 417 for an Expect header other
// than 100-continue), come out as the API's JSON
// errors through api.JSONErrors, with nothing of the request in them; normal
// answers on the same listener pass unchanged.
func TestServerErrorsAreJSON(t *testing.T) {
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("Connection", "close")
		fmt.Fprint(w, "ok")
	}))
	srv.Config.MaxHeaderBytes = 4 << 10
	srv.Listener = api.JSONErrors(srv.Listener)
	srv.Start()
	t.Cleanup(srv.Close)
	addr := strings.TrimPrefix(srv.URL, "http://")
	for _, tc := range []struct {
		name, req string
		status    int
		code      string
	}{
		{"headers too large", "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + strings.Repeat(canary, 2<<10) + "\r\n\r\n", 431,
			api.CodeHeadersTooLarge},
		{"malformed header", "GET / HTTP/1.1\r\nHost: x\r\n" + canary + "\r\n\r\n", 400, api.CodeBadRequest},
		{"bad host", "GET / HTTP/1.1\r\nHost: " + canary + "/\r\n\r\n", 400, api.CodeBadRequest},
		{"not HTTP", canary + "\r\n\r\n", 400, api.CodeBadRequest},
		{"unknown transfer coding", "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: " + strings.ToLower(canary) + "\r\n\r\n", 501,
			api.CodeBadRequest},
		{"unknown version", "GET / HTTP/3.7\r\nHost: x\r\n\r\n", 505, api.CodeBadRequest},
		{"unknown expectation", "POST / HTTP/1.1\r\nHost: x\r\nExpect: " + canary + "\r\nContent-Length: 1\r\n\r\nx", 417, api.CodeBadRequest},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := rawRequest(t, addr, tc.req)
			e := errorOf(t, resp.StatusCode, resp.Header, body)
			if resp.StatusCode != tc.status || e.Code != tc.code {
				t.Errorf("%d %s, want %d %s", resp.StatusCode, e.Code, tc.status, tc.code)
			}
			if bytes.Contains(bytes.ToUpper(body), []byte(canary)) {
				t.Errorf("the answer quotes the request: %q", body)
			}
			if resp.Header.Get("X-Content-Type-Options") != "nosniff" || resp.ContentLength != int64(len(body)) {
				t.Errorf("headers %v for a body of %d bytes", resp.Header, len(body))
			}
		})
	}
	// A handler's own text/plain answer, even one that closes the
	// connection, is not mistaken for the server's.
	resp, body := rawRequest(t, addr, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	if resp.StatusCode != 200 || string(body) != "ok" {
		t.Errorf("a normal answer: %d %q", resp.StatusCode, body)
	}
}
