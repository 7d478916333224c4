package fakeoai_test

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/vramq/vramq/internal/testenv/fakeoai"
)

// Each status fault answers with the body its server gives.
func TestStatusFaults(t *testing.T) {
	for _, c := range []struct {
		status int
		body   string
	}{
		{500, `{"error":{"message":"The server had an error while processing your request. Sorry about that!","type":"server_error","param":null,"code":null}}`},
		{503, `{"error":{"message":"The server is overloaded or not ready yet.","type":"server_error","param":null,"code":null}}`},
		{529, `{"error":{"message":"Overloaded","type":"overloaded_error","param":null,"code":null}}`},
		{424, `{"error":"Request failed during generation: injected by fakeoai","error_type":"generation"}`},
		{422, `{"error":"Input validation error: injected by fakeoai","error_type":"validation"}`},
		{429, `{"error":"Model is overloaded","error_type":"overloaded"}`},
		{413, `Failed to buffer the request body: length limit exceeded`},
	} {
		s := start(t, fakeoai.Config{Faults: []fakeoai.Fault{{Kind: fakeoai.FaultStatus, Status: c.status}}})
		res, got := post(t, s, "/v1/chat/completions", `{"model":"fake-model","messages":[{"role":"user","content":"hi"}]}`)
		if res.StatusCode != c.status || got != c.body {
			t.Errorf("fault %d: answered %d %s", c.status, res.StatusCode, got)
		}
		if res.Header.Get("Retry-After") != "" || res.Header.Get("retry-after-ms") != "" {
			t.Errorf("fault %d: a retry hint", c.status)
		}
	}
}

// Skip, Times and Paths choose the requests a fault takes.
func TestFaultSelection(t *testing.T) {
	s := start(t, fakeoai.Config{Faults: []fakeoai.Fault{
		{Kind: fakeoai.FaultStatus, Status: 503, Paths: []string{"/v1/embeddings"}},
		{Kind: fakeoai.FaultStatus, Status: 500, Skip: 1, Times: 2},
	}})
	var got []int
	for range 4 {
		res, _ := post(t, s, "/v1/completions", completionBody("x", 1))
		got = append(got, res.StatusCode)
	}
	res, _ := post(t, s, "/v1/embeddings", `{"model":"fake-model","input":"x"}`)
	got = append(got, res.StatusCode)
	if diff := cmp.Diff([]int{200, 500, 500, 200, 503}, got); diff != "" {
		t.Errorf("statuses (-want +got):\n%s", diff)
	}
	if st := s.Stats(); st.Faults[fakeoai.FaultStatus] != 3 || st.Admitted != 2 {
		t.Errorf("faults %v, admitted %d", st.Faults, st.Admitted)
	}
}

// A probability draws from the seed: the same seed and the same requests
// give the same faults.
func TestFaultRateIsSeeded(t *testing.T) {
	run := func(seed uint64) []int {
		s := start(t, fakeoai.Config{Seed: seed, Faults: []fakeoai.Fault{{Kind: fakeoai.FaultStatus, Status: 500, Rate: 0.3}}})
		var got []int
		for i := range 40 {
			if res, _ := post(t, s, "/v1/completions", completionBody("x", 1)); res.StatusCode == 500 {
				got = append(got, i)
			}
		}
		return got
	}
	a, b := run(7), run(7)
	if diff := cmp.Diff(a, b); diff != "" {
		t.Errorf("same seed, different faults (-first +second):\n%s", diff)
	}
	if len(a) == 0 || len(a) == 40 {
		t.Errorf("rate 0.3 failed %d of 40", len(a))
	}
	if diff := cmp.Diff(a, run(8)); diff == "" {
		t.Errorf("seeds 7 and 8 drew the same faults %v", a)
	}
}

// A dropped connection is an error in the client, not an answer; before,
// nothing is charged, after, everything is.
func TestDrop(t *testing.T) {
	for _, kind := range []fakeoai.FaultKind{fakeoai.FaultDrop, fakeoai.FaultDropAfter} {
		t.Run(string(kind), func(t *testing.T) {
			s := start(t, fakeoai.Config{Limits: fakeoai.RateLimits{TPM: 1000}, Faults: []fakeoai.Fault{{Kind: kind, Times: 1}}})
			res, err := s.Client().Post(s.URL()+"/v1/completions", "application/json", strings.NewReader(completionBody("a b", 5)))
			if err == nil {
				res.Body.Close()
				t.Fatalf("answered %d: want a connection error", res.StatusCode)
			}
			// The client sees the connection close before the server's
			// handler has returned and counted the drop.
			st := s.Stats()
			for deadline := time.Now().Add(5 * time.Second); st.ByStatus[0] == 0 && time.Now().Before(deadline); st = s.Stats() {
				time.Sleep(time.Millisecond)
			}
			wantTokens := map[fakeoai.FaultKind]int64{fakeoai.FaultDrop: 0, fakeoai.FaultDropAfter: 7}[kind]
			if st.ByStatus[0] != 1 || st.AdmittedTokens != wantTokens || st.Faults[kind] != 1 {
				t.Errorf("by status %v, admitted tokens %d (want %d), faults %v", st.ByStatus, st.AdmittedTokens, wantTokens, st.Faults)
			}
			if res, _ := post(t, s, "/v1/completions", completionBody("x", 1)); res.StatusCode != 200 {
				t.Errorf("the next request: %d", res.StatusCode)
			}
		})
	}
}

// The in-process client sees a drop as an error too.
func TestDropInProcess(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := fakeoai.NewUnstarted(fakeoai.Config{Faults: []fakeoai.Fault{{Kind: fakeoai.FaultDropAfter}}})
		defer s.Close()
		_, err := s.Client().Post(s.URL()+"/v1/completions", "application/json", strings.NewReader(completionBody("x", 1)))
		if err == nil {
			t.Error("a dropped connection answered")
		}
	})
}

// A slow body sends its first half, then stalls Delay.
func TestSlowBody(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := fakeoai.NewUnstarted(fakeoai.Config{Speed: 2, Faults: []fakeoai.Fault{{Kind: fakeoai.FaultSlowBody, Delay: 10 * time.Second}}})
		defer s.Close()
		res, err := s.Client().Post(s.URL()+"/v1/completions", "application/json", strings.NewReader(completionBody("x", 3)))
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		read := make(chan []byte)
		go func() {
			b, _ := io.ReadAll(res.Body)
			read <- b
		}()
		synctest.Wait()
		select {
		case b := <-read:
			t.Fatalf("the whole body came at once: %s", b)
		default:
		}
		time.Sleep(5 * time.Second) // 10 server seconds at Speed 2
		if b := <-read; !json.Valid(b) {
			t.Errorf("body %s", b)
		}
	})
}

func TestNotJSON(t *testing.T) {
	s := start(t, fakeoai.Config{Faults: []fakeoai.Fault{{Kind: fakeoai.FaultNotJSON, Times: 1}, {Kind: fakeoai.FaultNotJSON, Status: 502, Times: 1}}})
	for _, want := range []int{200, 502} {
		res, got := post(t, s, "/v1/completions", completionBody("x", 1))
		if res.StatusCode != want || !strings.HasPrefix(got, "<html>") || res.Header.Get("Content-Type") != "text/html" {
			t.Errorf("%d %q %s, want %d and HTML", res.StatusCode, res.Header.Get("Content-Type"), got, want)
		}
	}
	if res, got := post(t, s, "/v1/completions", completionBody("x", 1)); res.StatusCode != http.StatusOK || !json.Valid([]byte(got)) {
		t.Errorf("after the faults: %d %s", res.StatusCode, got)
	}
}

func TestFaultValidation(t *testing.T) {
	s := start(t, fakeoai.Config{})
	for _, f := range []fakeoai.Fault{
		{Kind: fakeoai.FaultStatus, Status: 200},
		{Kind: fakeoai.FaultSlowBody},
		{Kind: "bogus"},
		{Kind: fakeoai.FaultDrop, Rate: 1.5},
	} {
		if err := s.SetFaults(f); err == nil {
			t.Errorf("fault %+v accepted", f)
		}
	}
}
