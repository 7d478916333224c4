package fakeoai_test

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/vramq/vramq/internal/testenv/fakeoai"
)

// A response answers in OpenAI's Response shape, its usage the prompt's and
// the text's tokens, and incomplete where max_output_tokens cut it.
func TestResponsesShape(t *testing.T) {
	s := start(t, fakeoai.Config{})
	res, got := post(t, s, "/v1/responses", `{"model":"fake-model","instructions":"be brief","input":[{"role":"user","content":[{"type":"input_text","text":"hi [[len=5]]"}]}],"max_output_tokens":3}`)
	if res.StatusCode != http.StatusOK {
		t.Fatalf("%d %s", res.StatusCode, got)
	}
	var r struct {
		ID, Object, Status, Model string
		IncompleteDetails         *struct{ Reason string } `json:"incomplete_details"`
		Output                    []struct {
			Type, Role string
			Content    []struct{ Type, Text string }
		}
		Usage struct {
			InputTokens  int `json:"input_tokens"`
			OutputTokens int `json:"output_tokens"`
			TotalTokens  int `json:"total_tokens"`
		}
	}
	if err := json.Unmarshal([]byte(got), &r); err != nil {
		t.Fatal(err)
	}
	if r.Object != "response" || r.Status != "incomplete" || r.IncompleteDetails == nil || r.IncompleteDetails.Reason != "max_output_tokens" ||
		len(r.Output) != 1 || r.Output[0].Type != "message" || r.Output[0].Role != "assistant" || len(r.Output[0].Content) != 1 ||
		r.Output[0].Content[0].Type != "output_text" || r.Usage.OutputTokens != 3 || r.Usage.InputTokens == 0 ||
		r.Usage.TotalTokens != r.Usage.InputTokens+3 {
		t.Errorf("response %s", got)
	}
	if fakeoai.CountTokens(r.Output[0].Content[0].Text) != 3 {
		t.Errorf("text %q is not the 3 tokens of its usage", r.Output[0].Content[0].Text)
	}
	if res, got := post(t, s, "/v1/responses", `{"model":"fake-model","input":"hi"}`); res.StatusCode != http.StatusOK {
		t.Errorf("a string input: %d %s", res.StatusCode, got)
	}
	if res, got := post(t, s, "/v1/responses", `{"model":"fake-model"}`); res.StatusCode != http.StatusBadRequest {
		t.Errorf("no input: %d %s", res.StatusCode, got)
	}
}

// A moderation has a result per string of an array, flagged by the
// double's one rule.
func TestModerationsShape(t *testing.T) {
	s := start(t, fakeoai.Config{})
	res, got := post(t, s, "/v1/moderations", `{"model":"fake-model","input":["a calm day","an attack"]}`)
	if res.StatusCode != http.StatusOK {
		t.Fatalf("%d %s", res.StatusCode, got)
	}
	var m struct {
		ID, Model string
		Results   []struct {
			Flagged        bool
			Categories     map[string]bool    `json:"categories"`
			CategoryScores map[string]float64 `json:"category_scores"`
		}
	}
	if err := json.Unmarshal([]byte(got), &m); err != nil {
		t.Fatal(err)
	}
	flagged := []bool{}
	for _, r := range m.Results {
		flagged = append(flagged, r.Flagged)
		if len(r.Categories) != 13 || len(r.CategoryScores) != 13 || r.Categories["violence"] != r.Flagged {
			t.Errorf("result %+v", r)
		}
	}
	if diff := cmp.Diff([]bool{false, true}, flagged); diff != "" || m.Model != "fake-model" || m.ID == "" {
		t.Errorf("moderation %s (flagged -want +got %s)", got, diff)
	}
}
