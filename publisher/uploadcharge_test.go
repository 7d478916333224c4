package publisher

import (
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/vramq/vramq/internal/payload"
	"github.com/vramq/vramq/internal/testenv/sqstest"
)

// emptyBucket answers every request as S3 answers a ListObjectsV2 of a
// bucket with no keys.
type emptyBucket struct{}

func (emptyBucket) Do(r *http.Request) (*http.Response, error) {
	const body = `<?xml version="1.0" encoding="UTF-8"?><ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">` +
		`<Name>unused</Name><KeyCount>0</KeyCount><MaxKeys>1000</MaxKeys><IsTruncated>false</IsTruncated></ListBucketResult>`
	return &http.Response{StatusCode: http.StatusOK, Header: http.Header{"Content-Type": {"application/xml"}},
		Body: io.NopCloser(strings.NewReader(body)), Request: r}, nil
}

// startUpload sends from the headers of POST /v1/files declaring a body of
// declared bytes, the form up to the file, and file's bytes; it returns once
// the server has read them, or stopped reading (it refused the upload: answer
// says why). Call it in a synctest bubble.
func (s *pipeServer) startUpload(from string, declared int, file []byte) net.Conn {
	s.t.Helper()
	c := s.dial(from)
	if _, err := fmt.Fprintf(c, "POST /v1/files HTTP/1.1\r\nHost: x\r\nContent-Type: multipart/form-data; boundary=b\r\nContent-Length: %d\r\n\r\n", declared); err != nil {
		s.t.Fatalf("headers from %s: %v", from, err)
	}
	form := "--b\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n" +
		"--b\r\nContent-Disposition: form-data; name=\"file\"; filename=\"f.jsonl\"\r\nContent-Type: application/jsonl\r\n\r\n"
	go func() { _, _ = c.Write(append([]byte(form), file...)) }()
	synctest.Wait()
	return c
}

// TestTricklingUploadsLeaveRoomForOthers (issue 34, item 2): clients whose
// uploads stall after most of a file hold at most the uploads' half of the
// bodies in flight, and each client at most half of that: another client's
// POST finds room for a body at the limit. Before, an upload was held to its
// client's share alone, and three such clients held the whole budget, so that
// every other POST was 503.
func TestTricklingUploadsLeaveRoomForOthers(t *testing.T) {
	const limit = 256 << 10
	synctest.Test(t, func(t *testing.T) {
		// The content never goes to S3 here: a file that fits in one part
		// is stored once it has all come, and none of these does. The
		// bucket only answers the file count (-max-files), in process: a
		// DNS lookup inside the bubble would break every later test.
		store := payload.New(s3.New(s3.Options{Region: "us-east-1", BaseEndpoint: aws.String("http://s3.test"), UsePathStyle: true,
			Credentials: aws.AnonymousCredentials{}, HTTPClient: emptyBucket{}}), "unused")
		s := newPipeServer(t, Config{Payloads: store, MaxFileBytes: limit, API: API{MaxBodyBytes: limit, MaxBodyBytesInFlight: 4 * limit}})
		file := []byte(strings.Repeat(`{"custom_id":"x"}`+"\n", 200<<10/18))
		var held []net.Conn
		for client := range 3 {
			for range 2 {
				c := s.startUpload(fmt.Sprintf("198.51.100.%d:4000", client+1), limit+32<<10, file)
				held = append(held, c)
			}
		}
		used := bodiesInFlight(t, s.pub)
		t.Logf("uploads hold %d bytes", used)
		if used > 2*limit {
			t.Errorf("stalled uploads hold %d bytes of the %d in flight; want at most half", used, 4*limit)
		}
		other := httptest.NewRequest("POST", "/v1/jobs", strings.NewReader(strings.Repeat("x", limit)))
		other.RemoteAddr = "203.0.113.1:4000"
		_, release, err := s.pub.gate.ReadBody(httptest.NewRecorder(), other)
		release()
		if err != nil {
			t.Errorf("another client's body at the limit, with uploads stalled: %v; want room for it", err)
		}
		// Of each client's two, the second is over its share of the uploads
		// (429 too_many_bodies); the third client's are over the uploads'
		// part of the budget (503 overloaded).
		if got := gateValue(t, s.pub, "body_refusals_total", "reason", "client_bytes"); got != 2 {
			t.Errorf("body_refusals_total{reason=client_bytes} %v, want 2", got)
		}
		if got := gateValue(t, s.pub, "overloaded_total"); got != 2 {
			t.Errorf("overloaded_total %v, want 2", got)
		}
		for _, c := range held {
			c.Close()
		}
		synctest.Wait()
		if used := bodiesInFlight(t, s.pub); used != 0 {
			t.Errorf("after the uploads ended, %d bytes held", used)
		}
		time.Sleep(time.Second)
	})
}

// TestAnUploadIsChargedWhatItHolds (issue 34, item 2), through the handler
// and S3: an upload that has sent its first part and a little more holds
// that little, and is charged only that, while its client has not sent the
// rest; before, it stayed charged a whole part until its end.
func TestAnUploadIsChargedWhatItHolds(t *testing.T) {
	t.Parallel()
	c := sqstest.S3(t)
	store := payload.New(c, sqstest.Bucket(t, c))
	p, err := New(Config{Queue: nopQueue{}, Payloads: store, API: API{Logger: slog.New(slog.DiscardHandler), Registerer: prometheus.NewRegistry()}})
	if err != nil {
		t.Fatal(err)
	}
	src, in := io.Pipe()
	req := httptest.NewRequest(http.MethodPost, "/v1/files", src)
	req.Header.Set("Content-Type", "multipart/form-data; boundary=b")
	done := make(chan int)
	go func() {
		w := httptest.NewRecorder()
		p.Handler().ServeHTTP(w, req)
		done <- w.Code
	}()
	// Lines of 200 bytes: a part's worth is within the lines a file may have.
	line := []byte(`{"custom_id":"x","pad":"` + strings.Repeat("p", 175) + `"}` + "\n")
	var first []byte
	first = append(first, "--b\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n"+
		"--b\r\nContent-Disposition: form-data; name=\"file\"; filename=\"f.jsonl\"\r\n\r\n"...)
	for len(first) < payload.UploadPartBytes+100<<10 {
		first = append(first, line...)
	}
	// The write returns once the server has read it all: the first part,
	// sent to S3 before the server reads on, and what came after it. The
	// byte after that is read only once what came before is charged.
	if _, err := in.Write(first); err != nil {
		t.Fatal(err)
	}
	if _, err := in.Write(line[:1]); err != nil {
		t.Fatal(err)
	}
	used := bodiesInFlight(t, p)
	if used == 0 || used > 200<<10 {
		t.Errorf("an upload past its first part holds %d bytes of the bodies in flight; want what came after the part (about 100 KiB)", used)
	}
	_, _ = in.Write(line[1:])
	_, _ = in.Write([]byte("\r\n--b--\r\n"))
	in.Close()
	if code := <-done; code != http.StatusOK {
		t.Errorf("the upload: %d", code)
	}
	if used := bodiesInFlight(t, p); used != 0 {
		t.Errorf("after the upload, %d bytes held", used)
	}
}
