package sdkclients

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/responses"

	"github.com/vramq/vramq/internal/testenv/fakeoai"
	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/publisher"
	"github.com/vramq/vramq/publisher/publishertest"
)

// Issue 35, item 1: a deployment whose servers serve /v1/responses and
// /v1/moderations (-served-endpoints) runs batches of both, and openai-go
// reads each output line's body as its own type: a responses.Response
// (its output text, its usage in the batch's), an openai.ModerationNewResponse
// (a result per input, the flagged one flagged).
func TestBatchResponsesAndModerationsWithTheOpenAISDK(t *testing.T) {
	t.Parallel()
	srv := fakeoai.New(fakeoai.Config{OutputTokens: func(string, int) int { return 5 }})
	defer srv.Close()
	s := newStack(t, publisher.Config{
		Jobs: publisher.Jobs{ChunkItems: 2, ServedEndpoints: []string{job.EndpointChatCompletions, job.EndpointResponses, job.EndpointModerations}},
		API: publisher.API{
			APIKeys: []string{"acme:key-a"},
		},
	})
	a := s.sdk("key-a")
	s.run(publishertest.ServerModel(t, srv), nil)
	const n = 3
	lines := func(url, body string) []byte {
		var in bytes.Buffer
		for i := range n {
			fmt.Fprintf(&in, `{"custom_id":"r-%d","method":"POST","url":%q,"body":%s}`+"\n", i, url, fmt.Sprintf(body, i))
		}
		return in.Bytes()
	}

	f := sdkUpload(t, a, "responses.jsonl", lines("/v1/responses", `{"model":"fake-model","input":"question %d","max_output_tokens":20}`))
	bt := sdkNewBatch(t, a, f.ID, openai.BatchNewParamsEndpointV1Responses)
	done := sdkWaitBatch(t, a, bt.ID, time.Minute, openai.BatchStatusCompleted)
	if done.RequestCounts.Completed != n || done.Usage.OutputTokens != 5*n || done.Usage.InputTokens == 0 {
		t.Errorf("responses batch: %s", done.RawJSON())
	}
	for i, l := range sdkFileLines(t, a, done.OutputFileID) {
		var r responses.Response
		if l.Response == nil || json.Unmarshal(l.Response.Body, &r) != nil || !strings.HasPrefix(r.ID, "resp_") ||
			r.Status != responses.ResponseStatusCompleted || r.OutputText() == "" || r.Usage.OutputTokens != 5 {
			t.Errorf("responses line %d: %+v", i, l)
		}
	}

	f = sdkUpload(t, a, "moderations.jsonl", lines("/v1/moderations", `{"model":"fake-model","input":["calm %d","an attack"]}`))
	bt = sdkNewBatch(t, a, f.ID, openai.BatchNewParamsEndpointV1Moderations)
	done = sdkWaitBatch(t, a, bt.ID, time.Minute, openai.BatchStatusCompleted)
	if done.RequestCounts.Completed != n {
		t.Errorf("moderations batch: %s", done.RawJSON())
	}
	for i, l := range sdkFileLines(t, a, done.OutputFileID) {
		var m openai.ModerationNewResponse
		if l.Response == nil || json.Unmarshal(l.Response.Body, &m) != nil || len(m.Results) != 2 ||
			m.Results[0].Flagged || !m.Results[1].Flagged || !m.Results[1].Categories.Violence ||
			len(m.Results[1].CategoryAppliedInputTypes.Violence) == 0 {
			t.Errorf("moderations line %d: %+v", i, l)
		}
	}
}
