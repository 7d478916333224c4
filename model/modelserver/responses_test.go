package modelserver

import (
	"encoding/json"
	"log/slog"
	"net/http"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/vramq/vramq/internal/testenv/fakeoai"
	"github.com/vramq/vramq/job"
)

// Items of a /v1/responses or /v1/moderations job go to that route of the
// server, their canonical bodies as sent (a response's ceiling added), and
// their answers come back whole; a body the route's rule refuses reaches
// no server.
func TestResponsesAndModerationsAreForwarded(t *testing.T) {
	s := fakeoai.New(fakeoai.Config{OutputTokens: func(string, int) int { return 6 }})
	defer s.Close()
	rec := &paths{next: s.Client().Transport}
	m, err := Open(t.Context(), Config{BaseURL: s.URL(), Models: []string{"fake-model"},
		HTTPClient: &http.Client{Transport: rec}, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	for _, c := range []struct {
		endpoint, good, bad, field string
	}{
		{job.EndpointResponses, `{"model":"fake-model","input":"hi","max_output_tokens":20}`, `{"model":"fake-model","input":"hi","background":true}`, "output"},
		{job.EndpointModerations, `{"model":"fake-model","input":["a","an attack"]}`, `{"model":"fake-model","input":[1]}`, "results"},
	} {
		outs, err := m.Run(t.Context(), c.endpoint, []job.Item{{ID: "good", Body: json.RawMessage(c.good)}, {ID: "bad", Body: json.RawMessage(c.bad)}})
		if err != nil {
			t.Fatal(err)
		}
		var body map[string]json.RawMessage
		if o := outs[0]; o.Error != nil || o.Response == nil || o.Response.StatusCode != 200 || json.Unmarshal(o.Response.Body, &body) != nil || body[c.field] == nil {
			t.Errorf("%s: the good item's output %+v (error %v)", c.endpoint, o, o.Error)
		}
		if o := outs[1]; o.Error == nil || o.Error.Code != job.ItemInvalidInput || o.Response != nil {
			t.Errorf("%s: the bad item's output %+v", c.endpoint, o)
		}
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	var posts []string
	for _, p := range rec.seen {
		if p[0] == 'P' {
			posts = append(posts, p)
		}
	}
	if diff := cmp.Diff([]string{"POST /v1/responses ", "POST /v1/moderations "}, posts); diff != "" {
		t.Errorf("requests (-want +got):\n%s", diff)
	}
}
