package modelserver

import (
	"encoding/json"
	"fmt"
	"os"

	"github.com/vramq/vramq/gpu"
	"github.com/vramq/vramq/job"
)

// hfConfig is what a Hugging Face config.json says about a decoder's
// attention; multimodal models keep it under text_config.
type hfConfig struct {
	NumHiddenLayers   int       `json:"num_hidden_layers"`
	NumAttentionHeads int       `json:"num_attention_heads"`
	NumKeyValueHeads  int       `json:"num_key_value_heads"`
	HiddenSize        int       `json:"hidden_size"`
	HeadDim           int       `json:"head_dim"`
	TorchDType        string    `json:"torch_dtype"`
	DType             string    `json:"dtype"` // newer transformers write dtype
	TextConfig        *hfConfig `json:"text_config"`
}

// kvBytesPerToken reads the KV cache one token takes from a model's
// config.json: 2 (a key and a value) × layers × KV heads × head dim × bytes
// per value, the formula TGI sizes its cache by (as issue 27 and
// DESIGN.md's "Model servers" section record it), which gives 128 KiB for Llama-3-8B (32 layers, 8 KV heads, head dim 128, bf16). A
// model without num_key_value_heads has one KV head per attention head
// (multi-head attention); one without head_dim has hidden_size / heads.
// perValue, when positive, overrides the dtype's bytes (an fp8 KV cache
// takes 1 whatever the weights' dtype).
func kvBytesPerToken(path string, perValue int) (int64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	var c hfConfig
	if err := json.Unmarshal(b, &c); err != nil {
		return 0, fmt.Errorf("%s: %w", path, err)
	}
	if c.NumHiddenLayers == 0 && c.TextConfig != nil {
		dtype := c.TorchDType
		c = *c.TextConfig
		if c.TorchDType == "" {
			c.TorchDType = dtype
		}
	}
	if c.NumHiddenLayers <= 0 || c.NumAttentionHeads <= 0 {
		return 0, fmt.Errorf("%s: num_hidden_layers %d, num_attention_heads %d: want both positive",
			path, c.NumHiddenLayers, c.NumAttentionHeads)
	}
	kvHeads := c.NumKeyValueHeads
	if kvHeads == 0 {
		kvHeads = c.NumAttentionHeads
	}
	headDim := c.HeadDim
	if headDim == 0 {
		if c.HiddenSize <= 0 || c.HiddenSize%c.NumAttentionHeads != 0 {
			return 0, fmt.Errorf("%s: no head_dim, and hidden_size %d is not a multiple of %d heads", path, c.HiddenSize, c.NumAttentionHeads)
		}
		headDim = c.HiddenSize / c.NumAttentionHeads
	}
	bytes := perValue
	if bytes <= 0 {
		dtype := c.TorchDType
		if dtype == "" {
			dtype = c.DType
		}
		switch dtype {
		case "bfloat16", "float16", "half":
			bytes = 2
		case "float32", "float":
			bytes = 4
		case "":
			return 0, fmt.Errorf("%s: no torch_dtype: give the KV bytes per value", path)
		default:
			return 0, fmt.Errorf("%s: torch_dtype %q: give the KV bytes per value", path, dtype)
		}
	}
	return 2 * int64(c.NumHiddenLayers) * int64(kvHeads) * int64(headDim) * int64(bytes), nil
}

var _ gpu.Itemwise = (*Model)(nil)

// ItemCosts is each item's KV charge in device bytes, as Cost
// charges them (0 for an item Run refuses without a request): a request
// holds the cache only while it is in flight, so the subscriber gives back
// an item's charge when its answer arrives.
func (m *Model) ItemCosts(endpoint string, items []job.Item) []int64 {
	cs := make([]int64, len(items))
	for i, it := range items {
		if r, refused := m.parse(endpoint, it); refused == nil {
			cs[i] = m.kvTokens(r) * m.unit
		}
	}
	return cs
}
