package publisher_test

// A client of the publisher's Files and Batches API over net/http, for the
// tests that need a client but are not about an SDK's reading of the API:
// the product's module does not depend on openai-go (issue 32), whose tests
// are harness/sdkclients's. The shapes are those of OpenAI's API reference
// (https://platform.openai.com/docs/api-reference/files,
// https://platform.openai.com/docs/api-reference/batch), only the fields
// the tests read.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"strconv"
)

// apiClient calls the API under base (".../v1") with key, when not empty.
type apiClient struct {
	base, key string
}

// client is a client of s's API with key.
func (s *server) client(key string) *apiClient { return &apiClient{base: s.url + "/v1", key: key} }

// rawObject is an API object's JSON, kept for messages and for the tests
// that tell an absent or null field from an empty one.
type rawObject struct{ raw []byte }

func (r *rawObject) RawJSON() string {
	if r == nil {
		return "<nil>"
	}
	return string(r.raw)
}

// field is the JSON of the object's key: "" when absent, "null" when null.
func (r *rawObject) field(key string) string {
	var m map[string]json.RawMessage
	_ = json.Unmarshal(r.raw, &m)
	return string(m[key])
}

type fileObject struct {
	rawObject
	ID        string `json:"id"`
	Object    string `json:"object"`
	Bytes     int64  `json:"bytes"`
	CreatedAt int64  `json:"created_at"`
	ExpiresAt int64  `json:"expires_at"`
	Filename  string `json:"filename"`
	Purpose   string `json:"purpose"`
}

type batch struct {
	rawObject
	ID            string            `json:"id"`
	Status        string            `json:"status"`
	Model         string            `json:"model"`
	InputFileID   string            `json:"input_file_id"`
	OutputFileID  string            `json:"output_file_id"`
	ErrorFileID   string            `json:"error_file_id"`
	Metadata      map[string]string `json:"metadata"`
	CreatedAt     int64             `json:"created_at"`
	InProgressAt  int64             `json:"in_progress_at"`
	FinalizingAt  int64             `json:"finalizing_at"`
	CompletedAt   int64             `json:"completed_at"`
	FailedAt      int64             `json:"failed_at"`
	ExpiresAt     int64             `json:"expires_at"`
	ExpiredAt     int64             `json:"expired_at"`
	CancellingAt  int64             `json:"cancelling_at"`
	CancelledAt   int64             `json:"cancelled_at"`
	RequestCounts struct {
		Total     int64 `json:"total"`
		Completed int64 `json:"completed"`
		Failed    int64 `json:"failed"`
	} `json:"request_counts"`
	Errors struct {
		Data []struct {
			Code    string `json:"code"`
			Message string `json:"message"`
			Param   string `json:"param"`
			Line    int64  `json:"line"`
		} `json:"data"`
	} `json:"errors"`
}

// page is a list answer.
type page[T any] struct {
	rawObject
	Data    []T  `json:"data"`
	HasMore bool `json:"has_more"`
}

// apiErr is an answer that is not 2xx, with OpenAI's error object when
// the body is one; Type and Param are nil when the object lacks them.
type apiErr struct {
	StatusCode int
	Message    string
	Code       string
	Type       *string
	Param      *string
	raw        []byte
}

func (e *apiErr) Error() string { return fmt.Sprintf("%d %s", e.StatusCode, e.raw) }

// do sends a request and decodes a 2xx answer into out (with its raw JSON,
// when out embeds rawObject; as is, when out is a *[]byte), or returns the
// answer as an *apiErr.
func (c *apiClient) do(ctx context.Context, method, path, contentType string, body io.Reader, out any) error {
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, body)
	if err != nil {
		return err
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	if c.key != "" {
		req.Header.Set("Authorization", "Bearer "+c.key)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		return err
	}
	if res.StatusCode/100 != 2 {
		e := &apiErr{StatusCode: res.StatusCode, raw: b}
		var w struct {
			Error struct {
				Message string  `json:"message"`
				Code    string  `json:"code"`
				Type    *string `json:"type"`
				Param   *string `json:"param"`
			} `json:"error"`
		}
		if json.Unmarshal(b, &w) == nil {
			e.Message, e.Code, e.Type, e.Param = w.Error.Message, w.Error.Code, w.Error.Type, w.Error.Param
		}
		return e
	}
	switch out := out.(type) {
	case nil:
		return nil
	case *[]byte: // a file's content, not JSON
		*out = b
		return nil
	}
	if r, ok := out.(interface{ setRaw([]byte) }); ok {
		r.setRaw(b)
	}
	if err := json.Unmarshal(b, out); err != nil {
		return fmt.Errorf("%s %s answered %s: %w", method, path, b, err)
	}
	return nil
}

func (r *rawObject) setRaw(b []byte) { r.raw = b }

// fileParams is an upload: the file's name and bytes, its purpose (batch
// when empty) and expires_after's seconds, when not 0.
type fileParams struct {
	name         string
	data         []byte
	purpose      string
	expiresAfter int64
}

func (c *apiClient) newFile(ctx context.Context, p fileParams) (*fileObject, error) {
	if p.purpose == "" {
		p.purpose = "batch"
	}
	var body bytes.Buffer
	w := multipart.NewWriter(&body)
	fields := [][2]string{{"purpose", p.purpose}}
	if p.expiresAfter != 0 {
		fields = append(fields, [2]string{"expires_after[anchor]", "created_at"},
			[2]string{"expires_after[seconds]", strconv.FormatInt(p.expiresAfter, 10)})
	}
	for _, f := range fields {
		if err := w.WriteField(f[0], f[1]); err != nil {
			return nil, err
		}
	}
	part, err := w.CreateFormFile("file", p.name)
	if err != nil {
		return nil, err
	}
	if _, err := part.Write(p.data); err != nil {
		return nil, err
	}
	if err := w.Close(); err != nil {
		return nil, err
	}
	f := &fileObject{}
	return f, c.do(ctx, http.MethodPost, "/files", w.FormDataContentType(), &body, f)
}

func (c *apiClient) getFile(ctx context.Context, id string) (*fileObject, error) {
	f := &fileObject{}
	return f, c.do(ctx, http.MethodGet, "/files/"+id, "", nil, f)
}

// fileContent is the bytes of file id.
func (c *apiClient) fileContent(ctx context.Context, id string) ([]byte, error) {
	var b []byte
	err := c.do(ctx, http.MethodGet, "/files/"+id+"/content", "", nil, &b)
	return b, err
}

func (c *apiClient) deleteFile(ctx context.Context, id string) error {
	return c.do(ctx, http.MethodDelete, "/files/"+id, "", nil, nil)
}

// listFiles lists with query ("limit=1&purpose=batch"), which may be empty.
func (c *apiClient) listFiles(ctx context.Context, query string) (*page[fileObject], error) {
	p := &page[fileObject]{}
	return p, c.do(ctx, http.MethodGet, "/files?"+query, "", nil, p)
}

// batchParams is a create's body; completion_window is 24h when empty.
type batchParams struct {
	InputFileID      string            `json:"input_file_id"`
	Endpoint         string            `json:"endpoint"`
	CompletionWindow string            `json:"completion_window"`
	Metadata         map[string]string `json:"metadata,omitempty"`
}

func (c *apiClient) createBatch(ctx context.Context, p batchParams) (*batch, error) {
	if p.CompletionWindow == "" {
		p.CompletionWindow = "24h"
	}
	body, err := json.Marshal(p)
	if err != nil {
		return nil, err
	}
	b := &batch{}
	return b, c.do(ctx, http.MethodPost, "/batches", "application/json", bytes.NewReader(body), b)
}

func (c *apiClient) getBatch(ctx context.Context, id string) (*batch, error) {
	b := &batch{}
	return b, c.do(ctx, http.MethodGet, "/batches/"+id, "", nil, b)
}

func (c *apiClient) cancelBatch(ctx context.Context, id string) (*batch, error) {
	b := &batch{}
	return b, c.do(ctx, http.MethodPost, "/batches/"+id+"/cancel", "", nil, b)
}

// apiError shows an error with the answer's body.
func apiError(err error) string {
	var e *apiErr
	if errors.As(err, &e) {
		return e.Error()
	}
	return fmt.Sprint(err)
}
