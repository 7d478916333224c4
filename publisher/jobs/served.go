package jobs

import (
	"slices"

	"github.com/vramq/vramq/job"
)

// DefaultServedEndpoints are the endpoints of OpenAI's that every model
// server a subscriber may front serves (vLLM, SGLang, llama.cpp, TGI,
// Ollama; TEI and the in-process models embeddings only): a deployment
// whose servers serve /v1/responses (vLLM) or /v1/moderations lists them
// too (Config.ServedEndpoints).
var DefaultServedEndpoints = []string{job.EndpointChatCompletions, job.EndpointCompletions, job.EndpointEmbeddings}

// Serves reports whether a job or batch for endpoint is taken: one the
// deployment lists as served, or Anthropic's Messages, which a subscriber
// translates to chat completions where its server has no /v1/messages.
func (l RequestLimits) Serves(endpoint string) bool {
	served := l.Endpoints
	if len(served) == 0 {
		served = DefaultServedEndpoints
	}
	return endpoint == job.EndpointMessages || slices.Contains(served, endpoint)
}

// ServedList is what the deployment serves, for a refusal's message.
func (l RequestLimits) ServedList() []string {
	if len(l.Endpoints) == 0 {
		return DefaultServedEndpoints
	}
	return l.Endpoints
}
