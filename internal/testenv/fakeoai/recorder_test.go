package fakeoai_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/vramq/vramq/internal/testenv/fakeoai"
)

// A Recorder keeps each item's statuses, and counts the 200s written from
// a time on (the real-time benchmark's shares after minute 0).
func TestRecorderCountsAnswersSince(t *testing.T) {
	s := fakeoai.New(fakeoai.Config{Faults: []fakeoai.Fault{{Kind: fakeoai.FaultStatus, Status: 503, Skip: 1, Times: 1}}})
	defer s.Close()
	rec := fakeoai.NewRecorder(t, s)
	ask := func(content string) int {
		res, err := http.Post(rec.URL()+"/v1/chat/completions", "application/json",
			strings.NewReader(`{"model":"fake-model","max_tokens":2,"messages":[{"role":"user","content":"`+content+`"}]}`))
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		return res.StatusCode
	}
	before := time.Now()
	if st := ask("a"); st != 200 {
		t.Fatalf("first answer %d", st)
	}
	between := time.Now()
	if st := ask("b"); st != 503 {
		t.Fatalf("second answer %d, want the fault's 503", st)
	}
	if st := ask("b"); st != 200 {
		t.Fatalf("third answer %d", st)
	}
	if got := rec.OKSince(before); got != 2 {
		t.Errorf("OKSince(before every request) = %d, want 2 (the 503 not counted)", got)
	}
	if got := rec.OKSince(between); got != 1 {
		t.Errorf("OKSince(after the first answer) = %d, want 1", got)
	}
	if got := rec.OKSince(time.Now().Add(time.Second)); got != 0 {
		t.Errorf("OKSince(later) = %d, want 0", got)
	}
	if a := rec.Answers(); len(a["a"]) != 1 || len(a["b"]) != 2 || a["b"][0] != 503 || a["b"][1] != 200 {
		t.Errorf("Answers() = %v, want a: [200], b: [503 200]", a)
	}
	// b's 503 and its retry are no answer asked again; a asked again,
	// through another client of the same server, is one.
	if n := fakeoai.AskedAfterAnswer(rec); n != 0 {
		t.Errorf("AskedAfterAnswer = %d before any answer was asked again, want 0", n)
	}
	other := fakeoai.NewRecorder(t, s)
	res, err := http.Post(other.URL()+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"fake-model","max_tokens":2,"messages":[{"role":"user","content":"a"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if n := fakeoai.AskedAfterAnswer(rec, other); n != 1 {
		t.Errorf("AskedAfterAnswer = %d after a was asked again through another client, want 1", n)
	}
	if n := fakeoai.AskedAfterAnswer(other); n != 0 {
		t.Errorf("AskedAfterAnswer(other alone) = %d, want 0: it answered a once", n)
	}
}
