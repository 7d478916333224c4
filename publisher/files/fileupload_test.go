package files

import (
	"errors"
	"io"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"
	"testing/iotest"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vramq/vramq/internal/payload"
	"github.com/vramq/vramq/publisher/api"
)

// lineCheck counts JSONL lines as MaxFileLines documents them, whatever
// the reads' sizes, and refuses the read that goes over a limit.
func TestLineCheck(t *testing.T) {
	for _, tc := range []struct {
		name, file string
		maxBytes   int64
		maxLines   int
		maxLine    int64
		lines      int
		code       string // the refusal's, or "" for none
	}{
		{"empty", "", 100, 3, 10, 0, ""},
		{"a last newline starts no line", "a\nb\n", 100, 2, 10, 2, ""},
		{"a last line without its newline counts", "a\nb", 100, 2, 10, 2, ""},
		{"empty lines count", "a\n\n\nb\n", 100, 4, 10, 4, ""},
		{"one line over the count", "a\nb\nc", 100, 2, 10, 0, CodeTooManyLines},
		{"a line at its limit", "0123456789\n", 100, 2, 10, 1, ""},
		{"a line over it, newline not counted", "a\n01234567890\n", 100, 5, 10, 0, CodeLineTooLarge},
		{"a last line over it", "a\n01234567890", 100, 5, 10, 0, CodeLineTooLarge},
		{"a file at its limit", "0123\n5678\n", 10, 5, 10, 2, ""},
		{"a file over it", "0123\n5678\nx", 10, 5, 10, 0, CodeFileTooLarge},
	} {
		for _, one := range []bool{false, true} {
			var r io.Reader = strings.NewReader(tc.file)
			if one {
				r = iotest.OneByteReader(r)
			}
			c := &lineCheck{r: r, maxBytes: tc.maxBytes, maxLines: tc.maxLines, maxLineBytes: tc.maxLine}
			_, err := io.Copy(io.Discard, c)
			var e *api.Error
			switch {
			case tc.code == "" && (err != nil || c.lines != tc.lines):
				t.Errorf("%s (byte by byte: %v): %d lines, %v; want %d lines", tc.name, one, c.lines, err, tc.lines)
			case tc.code != "" && (!errors.As(err, &e) || e.Code != tc.code || e.Param != "file" || c.err != err):
				t.Errorf("%s (byte by byte: %v): %v; want %s", tc.name, one, err, tc.code)
			}
		}
	}
}

// TestAnUploadGivesBackWhatItSent (issue 34, item 2): an upload is charged
// for the bytes it holds: those of the part it is filling, given back once
// payload.Upload has sent the part (Resume), and charged anew as more come.
func TestAnUploadGivesBackWhatItSent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		gate, reg := testGate(t)
		charge, err := gate.OpenUpload(httptest.NewRequest("POST", "/v1/files", nil))
		if err != nil {
			t.Fatal(err)
		}
		defer charge.Release()
		src, in := io.Pipe()
		body := NewUploadBody(src, charge, api.StartPace(1<<20, time.Hour, func() {}), 1<<20)
		defer body.pace.Stop()
		check := &lineCheck{r: body, body: body, maxBytes: 1 << 30, maxLines: 1 << 20, maxLineBytes: 1 << 20}
		go func() {
			_, _ = in.Write([]byte(strings.Repeat("a\n", 500)))
			_, _ = in.Write([]byte(strings.Repeat("b\n", 100)))
			in.Close()
		}()
		buf := make([]byte, 1000)
		if _, err := io.ReadFull(check, buf); err != nil {
			t.Fatal(err)
		}
		if used := bodiesInFlight(t, reg); used != 1000 {
			t.Errorf("after 1000 bytes of a part: %d charged", used)
		}
		check.Pause()
		check.Resume() // the part went to S3
		if used := bodiesInFlight(t, reg); used != 0 {
			t.Errorf("after the part was sent: %d charged; want 0", used)
		}
		if _, err := io.ReadAll(check); err != nil {
			t.Fatal(err)
		}
		if used := bodiesInFlight(t, reg); used != 200 {
			t.Errorf("after 200 bytes of the next part: %d charged", used)
		}
		charge.Release()
		if used := bodiesInFlight(t, reg); used != 0 {
			t.Errorf("released: %d bytes", used)
		}
	})
}

// testGate is a Gate with publisher.Config's default body limits, and the
// registry of its metrics.
func testGate(t *testing.T) (*api.Gate, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	g, err := api.NewGate(api.Config{MaxBodyBytes: 32 << 20, MaxBodyBytesInFlight: 64 << 20, MaxBodyBytesPerClient: 32 << 20,
		MaxBodiesPerClient: 16, MinBodyRate: 16 << 10, BodyGrace: 10 * time.Second, IPv6ClientPrefix: 56,
		UploadHeld: payload.UploadPartBytes, Logger: slog.New(slog.DiscardHandler), Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	return g, reg
}

// bodiesInFlight is the Gate's body_bytes_in_flight in reg.
func bodiesInFlight(t *testing.T, reg *prometheus.Registry) int64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "vramq_publisher_body_bytes_in_flight" {
			return int64(mf.GetMetric()[0].GetGauge().GetValue())
		}
	}
	t.Fatal("no vramq_publisher_body_bytes_in_flight")
	return 0
}
