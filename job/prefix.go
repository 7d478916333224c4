package job

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"slices"
)

// PrefixBytes is how much of a completion's prompt its prefix key covers: a
// server's prefix cache reuses whole blocks of leading tokens (vLLM's are 16
// tokens), so prompts that share their first PrefixBytes share at least the
// blocks those hold, a few hundred tokens.
const PrefixBytes = 1024

// PrefixKey is the key of the leading part of a request that a model server's
// prefix cache may serve from another request's work: for a chat, the model
// and every message before the last (the system prompt and the turns the
// items of a job have in common); for a completion, the model and the first
// PrefixBytes of its prompt, cut back to a space. "" when the request has no
// such part (a chat of one message, a shorter prompt, an embedding, a body
// that is not a request), which groups with nothing.
//
// The key is read from the one request, not from its job's other items, so
// that the publisher, which groups a job's items by it (PrefixOrder), and
// the subscriber, which prefers to send together what shares one, compute
// the same key without carrying it in the message. Its 16 hex digits are
// the first 64 bits of a SHA-256: a collision only orders two items as one
// group.
func PrefixKey(endpoint string, body []byte) string {
	var req struct {
		Model    string            `json:"model"`
		Messages []json.RawMessage `json:"messages"`
		Prompt   json.RawMessage   `json:"prompt"`
	}
	if json.Unmarshal(body, &req) != nil {
		return ""
	}
	h := sha256.New()
	h.Write([]byte(endpoint))
	h.Write([]byte{0})
	h.Write([]byte(req.Model))
	h.Write([]byte{0})
	switch endpoint {
	case EndpointChatCompletions:
		if len(req.Messages) < 2 {
			return ""
		}
		for _, m := range req.Messages[:len(req.Messages)-1] {
			var buf bytes.Buffer
			if json.Compact(&buf, m) != nil {
				return ""
			}
			h.Write(buf.Bytes())
			h.Write([]byte{0})
		}
	case EndpointCompletions:
		var p string
		if json.Unmarshal(req.Prompt, &p) != nil || len(p) <= PrefixBytes {
			return "" // a list of prompts or of tokens: no one leading part
		}
		lead := p[:PrefixBytes]
		if i := bytes.LastIndexAny([]byte(lead), " \t\n"); i > 0 {
			lead = lead[:i]
		}
		h.Write([]byte(lead))
	default:
		return ""
	}
	return hex.EncodeToString(h.Sum(nil)[:8])
}

// PrefixOrder is the order in which to send items whose prefix keys are
// keys: the items of each key together, the groups in the order their first
// item came, and each group's items in their own order; items without a key
// stay where they are relative to the groups, as groups of one. A stable
// order: a job cut by it is cut the same way when sent again.
func PrefixOrder(keys []string) []int {
	first := make(map[string]int, len(keys))
	rank := make([]int, len(keys))
	for i, k := range keys {
		if k == "" {
			rank[i] = i
			continue
		}
		if _, ok := first[k]; !ok {
			first[k] = i
		}
		rank[i] = first[k]
	}
	order := make([]int, len(keys))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return rank[a] - rank[b] })
	return order
}
