// Package job owns vramq's schemas and keys: the messages it puts on its
// queues (the work message a publisher sends for each chunk of a job, the
// result message a subscriber sends back, and their attributes), the records
// it keeps in the payload bucket (Manifest, FailedMarker) and that bucket's
// layout (ItemKey and the rest), and the grammar of job and item ids. All
// are versioned JSON; docs/schemas.md has the schemas.
package job

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Version is the schema version written in the "v" field of every message.
const Version = 1

// Message attribute names. The job id and chunk index travel in attributes too,
// so tools can route or de-duplicate without parsing the body.
const (
	AttrJobID  = "vramq-job-id"
	AttrChunk  = "vramq-chunk"
	AttrReason = "vramq-dlq-reason" // why a message was dead-lettered
	AttrSource = "vramq-source-message-id"
	AttrTenant = "vramq-tenant" // who sent the job (internal/tenant); absent when no one is named
)

// Item is one unit of work: a text to embed, an image to classify, or a
// request for a model server. Models read the fields they understand.
type Item struct {
	ID   string `json:"id"`
	Text string `json:"text,omitempty"`
	// Data carries binary content (base64 in JSON) for models that take it.
	Data []byte `json:"data,omitempty"`
	// Body, in an item of a job that names an endpoint (Work.Endpoint) and
	// only there, is that endpoint's request JSON, an object, as a client
	// would send it to OpenAI: the subscriber forwards it. It is carried as
	// the client sent it, compacted at most (and escaped by EncodeForSQS).
	Body json.RawMessage `json:"body,omitempty"`
	// Ref, instead of Text, Data and Body, points at the item stored in S3
	// because it was too large for a message (the claim-check pattern). The
	// object holds the JSON of the whole Item, without Ref. Consumers fetch
	// it and verify its size and SHA-256 before use.
	Ref *PayloadRef `json:"ref,omitempty"`
}

// PayloadRef points at an object in S3 that stands in for content too large
// for a message.
type PayloadRef struct {
	Bucket string `json:"bucket"`
	Key    string `json:"key"`
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"` // hex of the object's SHA-256
}

// Validate reports what makes r unusable.
func (r *PayloadRef) Validate() error {
	switch {
	case r.Bucket == "" || r.Key == "":
		return fmt.Errorf("%w: payload reference without bucket or key", ErrMalformed)
	case r.Size < 0:
		return fmt.Errorf("%w: payload reference with negative size %d", ErrMalformed, r.Size)
	case len(r.SHA256) != 64 || strings.Trim(r.SHA256, "0123456789abcdef") != "":
		return fmt.Errorf("%w: payload reference sha256 %q is not 64 lower-case hex digits", ErrMalformed, r.SHA256)
	}
	return nil
}

// Work is the body of a work message: one chunk of a job.
type Work struct {
	V      int    `json:"v"`
	JobID  string `json:"job_id"`
	Chunk  int    `json:"chunk"`
	Chunks int    `json:"chunks,omitempty"` // chunks in the whole job, when known
	// Endpoint, when set, is the OpenAI-compatible route every item's Body
	// is a request for (EndpointChatCompletions and the others); empty, the
	// items are text and data for an in-process model. Added in schema
	// version 1 without changing it, as Output.Error was.
	Endpoint string `json:"endpoint,omitempty"`
	Items    []Item `json:"items"`
}

// Key identifies a chunk across redeliveries: results with the same key are
// duplicates of each other.
type Key struct {
	JobID string
	Chunk int
}

func (w *Work) Key() Key { return Key{w.JobID, w.Chunk} }

// Output is a model's answer for one item.
type Output struct {
	ID        string          `json:"id"`
	Embedding []float32       `json:"embedding,omitempty"`
	Data      json.RawMessage `json:"data,omitempty"` // for models whose answer is not an embedding
	// Error, when set, says why the model refused this item; the item has
	// no embedding or data then. Added in schema version 1 without changing
	// it: a reader that does not know the field sees an output without an
	// answer.
	Error *ItemError `json:"error,omitempty"`
	// Response is the model server's answer to an item of a job with an
	// endpoint: on success (2xx) the output's only answer; when the server
	// refused the item itself (a 400 or 422), Error is set too, with code
	// ItemRequestRefused, and Response keeps the status and the server's
	// body, as OpenAI's Batch API keeps them in its error file. Added in
	// schema version 1 without changing it.
	Response *Response `json:"response,omitempty"`
}

// Response is a model server's answer to one request: its HTTP status code
// and its body, JSON as the server sent it (compacted at most).
type Response struct {
	StatusCode int             `json:"status_code"`
	Body       json.RawMessage `json:"body"`
}

// ItemError is why one item of a chunk could not be processed while the
// others were (docs/schemas.md).
type ItemError struct {
	Code    string `json:"code"`    // ItemInvalidInput, ItemTooLarge, ItemRequestRefused, ItemRequestTimeout or ItemUnsupportedEndpoint
	Message string `json:"message"` // the model's words: untrusted, escaped and cut (NewItemError)
}

// Item error codes.
const (
	ItemInvalidInput = "invalid_input" // the model refuses the item itself (fault.ErrInvalidInput)
	// ItemTooLarge: the model's estimate of the item's working memory alone
	// exceeds the largest budget the subscriber's device can give.
	ItemTooLarge = "too_large"
	// ItemRequestRefused: the model server refused the item's request
	// itself (400, 422: a context too long, an invalid request); the
	// message carries the status and the server's error message, and the
	// output's Response the status and body. Never retried.
	ItemRequestRefused = "request_refused"
	// ItemRequestTimeout: the item's request timed out on every try, by
	// the subscriber's per-request deadline or the server's (408, 504):
	// OpenAI's Batch API writes such a line to the error file with this
	// code.
	ItemRequestTimeout = "request_timeout"
	// ItemUnsupportedEndpoint: the item is a request for an endpoint
	// (Work.Endpoint) and the subscriber that took it runs an in-process
	// model, not a model server (-model-server): it answers the item with
	// this rather than run it or retry it.
	ItemUnsupportedEndpoint = "unsupported_endpoint"
)

// MaxItemErrorLen bounds an item error's message in bytes.
const MaxItemErrorLen = 512

// NewItemError returns the error for one refused item. The message may
// quote the item, which anyone who can send to the queue chose, so it is
// escaped as a DLQ reason is (AttributeSafe) and cut to MaxItemErrorLen
// without splitting a character.
func NewItemError(code, message string) *ItemError {
	m := AttributeSafe(message)
	if n := MaxItemErrorLen; len(m) > n {
		for n > 0 && !utf8.RuneStart(m[n]) {
			n--
		}
		m = m[:n]
	}
	return &ItemError{Code: code, Message: m}
}

// Result is the body of a result message: the outputs for one chunk.
type Result struct {
	V       int      `json:"v"`
	JobID   string   `json:"job_id"`
	Chunk   int      `json:"chunk"`
	Model   string   `json:"model"`
	Outputs []Output `json:"outputs"`
	// ItemsFailed counts the outputs with an Error; absent when none.
	ItemsFailed int `json:"items_failed,omitempty"`
	// Attempt is the work message's receive count when it was processed;
	// above 1 means the chunk was redelivered at least once.
	Attempt int `json:"attempt"`
	// WorkerMS is the time from receipt to result, in milliseconds.
	WorkerMS int64 `json:"worker_ms"`
	// Ref, when set, replaces Outputs: the result was too large for a
	// message and the whole Result is in S3 there.
	Ref *PayloadRef `json:"ref,omitempty"`
}

func (r *Result) Key() Key { return Key{r.JobID, r.Chunk} }

// ErrMalformed is wrapped by every decoding error: the message can never be
// processed as it is and belongs in the dead-letter queue.
var ErrMalformed = errors.New("malformed message")

// DecodeWork parses and validates a work message body.
func DecodeWork(body []byte) (*Work, error) {
	var w Work
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&w); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	if dec.More() {
		return nil, fmt.Errorf("%w: trailing data after the JSON object", ErrMalformed)
	}
	if err := w.Validate(); err != nil {
		return nil, err
	}
	return &w, nil
}

// MaxItems is the most items one work message may hold, whoever sent it:
// the publisher never cuts a larger chunk (its -max-chunk-items is bounded
// by it), and a subscriber dead-letters a message with more, since anyone
// who can send to the queue could pack ~40,000 items into 1 MiB and ask for
// a result a hundred times larger.
const MaxItems = 1000

// MaxResultBytes bounds the encoded result of one chunk: a subscriber
// dead-letters a chunk whose result is larger rather than store it, and the
// publisher reads no more than this of a stored result.
const MaxResultBytes = 64 << 20

// Validate reports the first thing that makes w unprocessable. Every error
// wraps ErrMalformed and quotes nothing but item ids (with QuoteID).
func (w *Work) Validate() error {
	switch {
	case w.V != Version:
		return fmt.Errorf("%w: schema version %d, want %d", ErrMalformed, w.V, Version)
	case w.JobID == "":
		return fmt.Errorf("%w: empty job_id", ErrMalformed)
	}
	if err := CheckJobID(w.JobID); err != nil {
		return fmt.Errorf("%w: job_id: %w", ErrMalformed, err)
	}
	switch {
	case w.Chunk < 0:
		return fmt.Errorf("%w: negative chunk %d", ErrMalformed, w.Chunk)
	case w.Chunks != 0 && w.Chunk >= w.Chunks:
		return fmt.Errorf("%w: chunk %d of %d", ErrMalformed, w.Chunk, w.Chunks)
	case len(w.Items) == 0:
		return fmt.Errorf("%w: no items", ErrMalformed)
	case len(w.Items) > MaxItems:
		return fmt.Errorf("%w: %d items; at most %d in one message", ErrMalformed, len(w.Items), MaxItems)
	case w.Endpoint != "" && !ValidEndpoint(w.Endpoint):
		// Not quoted: the sender chose it.
		return fmt.Errorf("%w: %w", ErrMalformed, ErrUnknownEndpoint)
	}
	seen := make(map[string]struct{}, len(w.Items))
	for i := range w.Items {
		it := &w.Items[i]
		if it.ID == "" {
			return fmt.Errorf("%w: item %d has an empty id", ErrMalformed, i)
		}
		if err := it.CheckFor(w.Endpoint); err != nil {
			return fmt.Errorf("item %d: %w", i, err)
		}
		if _, dup := seen[it.ID]; dup {
			return fmt.Errorf("%w: duplicate item id %s", ErrMalformed, QuoteID(it.ID))
		}
		seen[it.ID] = struct{}{}
	}
	return nil
}

// Attributes returns the message attributes that go with a work or result
// message for this chunk.
func Attributes(k Key) map[string]string {
	return map[string]string{AttrJobID: k.JobID, AttrChunk: strconv.Itoa(k.Chunk)}
}
