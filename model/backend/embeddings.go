package backend

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"

	"github.com/vramq/vramq/gpu"
	"github.com/vramq/vramq/job"
)

// An in-process embedding model serves items of a /v1/embeddings job
// itself: each item's inputs run as text items of the batch, and its output
// is the response OpenAI's embeddings endpoint gives, so that a client of
// that API (the Batch API's output file) reads it unchanged. Chat and
// completions need a generative model server; they stay unsupported here.

// embeddingsRequest is the part of an embeddings request body an in-process
// model reads; user is ignored.
type embeddingsRequest struct {
	Input          json.RawMessage `json:"input"`
	Model          string          `json:"model"`
	EncodingFormat string          `json:"encoding_format"`
	// Dimensions, when given, must be the model's own size: it cannot
	// shorten its vectors, and one of another size would be a silent
	// surprise to a client that asked.
	Dimensions *int `json:"dimensions"`
}

// embeddingsResponse is OpenAI's CreateEmbeddingResponse.
type embeddingsResponse struct {
	Object string          `json:"object"`
	Data   []embeddingData `json:"data"`
	Model  string          `json:"model"`
	Usage  embeddingsUsage `json:"usage"`
}

type embeddingData struct {
	Object    string `json:"object"`
	Index     int    `json:"index"`
	Embedding any    `json:"embedding"` // []float32, or a base64 string of little-endian float32s
}

type embeddingsUsage struct {
	PromptTokens int `json:"prompt_tokens"`
	TotalTokens  int `json:"total_tokens"`
}

// embedItem is one endpoint item read for an in-process model: its request,
// its inputs as texts, or why it cannot run (err, an item error).
type embedItem struct {
	req    embeddingsRequest
	inputs []string
	err    *job.ItemError
}

// readEmbedItem reads it's body. The publisher checked the body already,
// but the message is untrusted: whatever does not fit is the item's error.
func readEmbedItem(it job.Item) embedItem {
	var e embedItem
	if err := json.Unmarshal(it.Body, &e.req); err != nil {
		e.err = job.NewItemError(job.ItemInvalidInput, fmt.Sprintf("the embeddings request is not valid JSON: %v", err))
		return e
	}
	switch e.req.EncodingFormat {
	case "", "float", "base64":
	default:
		e.err = job.NewItemError(job.ItemInvalidInput, fmt.Sprintf(
			"encoding_format %q: an in-process model answers float or base64", e.req.EncodingFormat))
		return e
	}
	var one string
	if json.Unmarshal(e.req.Input, &one) == nil {
		e.inputs = []string{one}
	} else if json.Unmarshal(e.req.Input, &e.inputs) != nil || len(e.inputs) == 0 {
		e.inputs = nil
		e.err = job.NewItemError(job.ItemInvalidInput,
			"input: an in-process model embeds a string or a non-empty array of strings, not token ids")
	}
	return e
}

// embedTexts reads items and returns the text items their inputs make, in
// order; reads[i] says what item i became.
func embedTexts(items []job.Item) (reads []embedItem, texts []job.Item) {
	reads = make([]embedItem, len(items))
	for i, it := range items {
		reads[i] = readEmbedItem(it)
		for _, in := range reads[i].inputs {
			texts = append(texts, job.Item{ID: it.ID, Text: in})
		}
	}
	return reads, texts
}

// embeddingsCost is what the texts of items cost the model: an item costs
// what its inputs would as items of a text job.
func embeddingsCost(m gpu.Model, items []job.Item) int64 {
	_, texts := embedTexts(items)
	if len(texts) == 0 {
		return 0
	}
	return m.Cost(texts)
}

// Token counters, for usage: BERT's tokenizer gives the ids it runs ([CLS]
// and [SEP] included, as TEI counts them); the reference model counts its
// own tokens. A model with neither reports 0.
type (
	itemTokenizer interface {
		Tokens(job.Item) ([]int32, error)
	}
	tokenCounter interface{ CountTokens(string) int }
)

func countTokens(m gpu.Model, text job.Item) int {
	switch t := m.(type) {
	case itemTokenizer:
		ids, err := t.Tokens(text)
		if err != nil {
			return 0
		}
		return len(ids)
	case tokenCounter:
		return t.CountTokens(text.Text)
	}
	return 0
}

// runEmbeddings runs items of a /v1/embeddings job on an in-process model
// as one batch of their inputs. An error of the batch (out of memory,
// invalid input) is the batch's, for the caller to halve as for a text
// job; an input the model refuses alone fails its item.
func runEmbeddings(ctx context.Context, m gpu.Model, items []job.Item) ([]job.Output, error) {
	reads, texts := embedTexts(items)
	var outs []job.Output
	if len(texts) > 0 {
		var err error
		if outs, err = m.Run(ctx, texts); err != nil {
			return nil, err
		}
		if len(outs) != len(texts) {
			return nil, fmt.Errorf("model %s returned %d outputs for %d inputs", m.Name(), len(outs), len(texts))
		}
	}
	res := make([]job.Output, len(items))
	for i, it := range items {
		r := reads[i]
		res[i].ID = it.ID
		if r.err != nil {
			res[i].Error = r.err
			continue
		}
		mine := outs[:len(r.inputs)]
		outs = outs[len(r.inputs):]
		resp := embeddingsResponse{Object: "list", Model: r.req.Model, Data: make([]embeddingData, len(mine))}
		for k, o := range mine {
			if o.Error != nil {
				res[i].Error = job.NewItemError(o.Error.Code, fmt.Sprintf("input %d: %s", k, o.Error.Message))
				break
			}
			if len(o.Embedding) == 0 {
				res[i].Error = job.NewItemError(job.ItemInvalidInput, fmt.Sprintf("input %d: model %s gives no embedding", k, m.Name()))
				break
			}
			if n := r.req.Dimensions; n != nil && *n != len(o.Embedding) {
				res[i].Error = job.NewItemError(job.ItemInvalidInput, fmt.Sprintf(
					"dimensions %d: model %s gives %d", *n, m.Name(), len(o.Embedding)))
				break
			}
			d := embeddingData{Object: "embedding", Index: k, Embedding: o.Embedding}
			if r.req.EncodingFormat == "base64" {
				d.Embedding = base64Floats(o.Embedding)
			}
			resp.Data[k] = d
			resp.Usage.PromptTokens += countTokens(m, job.Item{ID: it.ID, Text: r.inputs[k]})
		}
		if res[i].Error != nil {
			continue
		}
		resp.Usage.TotalTokens = resp.Usage.PromptTokens
		body, err := json.Marshal(resp)
		if err != nil {
			return nil, err
		}
		res[i].Response = &job.Response{StatusCode: 200, Body: body}
	}
	return res, nil
}

// base64Floats is v as OpenAI's encoding_format "base64" gives it: the
// little-endian float32s, base64 with padding.
func base64Floats(v []float32) string {
	b := make([]byte, 4*len(v))
	for i, f := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(f))
	}
	return base64.StdEncoding.EncodeToString(b)
}
