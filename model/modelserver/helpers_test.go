package modelserver

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"testing/synctest"

	"github.com/vramq/vramq/internal/testenv/fakeoai"
	"github.com/vramq/vramq/job"
)

// inBubble runs f in a synctest bubble against a fakeoai server of fc,
// reached in process, with a Model opened on it from cfg (BaseURL, the
// client, the models and a quiet logger filled in).
func inBubble(t *testing.T, fc fakeoai.Config, cfg Config, f func(t *testing.T, s *fakeoai.Server, m *Model)) {
	t.Helper()
	synctest.Test(t, func(t *testing.T) {
		s := fakeoai.NewUnstarted(fc)
		defer s.Close()
		m := openOn(t, s, cfg)
		defer m.Close()
		f(t, s, m)
	})
}

func openOn(t *testing.T, s *fakeoai.Server, cfg Config) *Model {
	t.Helper()
	cfg.BaseURL, cfg.HTTPClient = s.URL(), s.Client()
	if cfg.Models == nil {
		cfg.Models = []string{"fake-model"}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	m, err := Open(t.Context(), cfg)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	return m
}

func chatItem(id, text string, maxTokens int) job.Item {
	mt := ""
	if maxTokens > 0 {
		mt = fmt.Sprintf(`,"max_tokens":%d`, maxTokens)
	}
	return job.Item{ID: id, Body: json.RawMessage(fmt.Sprintf(`{"model":"fake-model","messages":[{"role":"user","content":%q}]%s}`, text, mt))}
}

func completionItem(id, prompt string, maxTokens int) job.Item {
	return job.Item{ID: id, Body: json.RawMessage(fmt.Sprintf(`{"model":"fake-model","prompt":%q,"max_tokens":%d}`, prompt, maxTokens))}
}

func embedItem(id, text string) job.Item {
	return job.Item{ID: id, Body: json.RawMessage(fmt.Sprintf(`{"model":"fake-model","input":%q}`, text))}
}

func embedItems(n int) []job.Item {
	items := make([]job.Item, n)
	for i := range items {
		items[i] = embedItem(fmt.Sprintf("e%d", i), fmt.Sprintf("document number %d", i))
	}
	return items
}

// wantOK checks that every output is a 2xx Response without an Error.
func wantOK(t *testing.T, outs []job.Output) {
	t.Helper()
	for _, o := range outs {
		if o.Error != nil || o.Response == nil || o.Response.StatusCode/100 != 2 {
			t.Errorf("output %s: error %+v, response %+v; want a 2xx answer", o.ID, o.Error, o.Response)
		}
	}
}

// embeddingOf decodes an item's embeddings answer: its one vector.
func embeddingOf(t *testing.T, o job.Output) []float64 {
	t.Helper()
	var b struct {
		Data []struct {
			Index     int       `json:"index"`
			Embedding []float64 `json:"embedding"`
		} `json:"data"`
	}
	if o.Response == nil || json.Unmarshal(o.Response.Body, &b) != nil || len(b.Data) != 1 || b.Data[0].Index != 0 {
		t.Fatalf("output %s: %+v; want an embeddings answer with one entry of index 0", o.ID, o.Response)
	}
	return b.Data[0].Embedding
}

func (m *Model) answered(row string) int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.answers[row]
}

func quiet() *slog.Logger { return slog.New(slog.DiscardHandler) }

// handlerTransport serves requests with a handler in process.
type handlerTransport struct{ h http.Handler }

func (t handlerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	rec := httptest.NewRecorder()
	t.h.ServeHTTP(rec, r)
	return rec.Result(), nil
}

// http404For serves 404 on path and the rest from h.
func http404For(path string, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == path {
			http.NotFound(w, r)
			return
		}
		h.ServeHTTP(w, r)
	})
}

func httpClient(rt http.RoundTripper) *http.Client { return &http.Client{Transport: rt} }

// openKV is Open, with the model's KV cache.
func openKV(ctx context.Context, cfg Config) (*Model, *KV, error) {
	m, err := Open(ctx, cfg)
	if err != nil {
		return nil, nil, err
	}
	return m, m.dev, nil
}
