package faultproxy

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
)

// batchActions are the SQS calls whose response lists failed entries.
var batchActions = map[string]bool{
	"SendMessageBatch":             true,
	"DeleteMessageBatch":           true,
	"ChangeMessageVisibilityBatch": true,
}

// failedEntry is one entry of a batch response's Failed list
// (BatchResultErrorEntry).
type failedEntry struct {
	ID          string `json:"Id"`
	Code        string `json:"Code"`
	Message     string `json:"Message,omitempty"`
	SenderFault bool   `json:"SenderFault"`
}

type failedKey struct{}

// partial fails some entries of a batch call: they are taken out of the
// request, which goes on with the rest, and put in the response's Failed
// list. A request it cannot read as a batch goes on unchanged.
func (p *Proxy) partial(w http.ResponseWriter, r *http.Request, action string) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		drop(w) // the client's connection broke while sending
		return
	}
	var req map[string]json.RawMessage
	var entries []json.RawMessage
	if json.Unmarshal(body, &req) != nil || json.Unmarshal(req["Entries"], &entries) != nil || len(entries) == 0 {
		p.forward(w, r, body, nil)
		return
	}
	chosen := p.pick(len(entries))
	var keep []json.RawMessage
	var failed []failedEntry
	for i, e := range entries {
		if !chosen[i] {
			keep = append(keep, e)
			continue
		}
		var id struct {
			ID string `json:"Id"`
		}
		_ = json.Unmarshal(e, &id)
		failed = append(failed, failedEntry{ID: id.ID, Code: "InternalError",
			Message: "Internal error (entry failed by faultproxy).", SenderFault: false})
	}
	if len(keep) == 0 {
		// Nothing left to forward: answer as SQS would with every entry failed.
		out, _ := json.Marshal(map[string]any{"Successful": []any{}, "Failed": failed})
		p.count(KindPartialBatch, action, 1)
		p.count(KindFailedEntry, action, int64(len(failed)))
		p.writeJSON(w, http.StatusOK, out)
		return
	}
	req["Entries"], _ = json.Marshal(keep)
	body, _ = json.Marshal(req)
	p.forward(w, r, body, failed)
}

// forward sends r on with body in place of its own, and with failed added to
// the response's Failed list when the call succeeds.
func (p *Proxy) forward(w http.ResponseWriter, r *http.Request, body []byte, failed []failedEntry) {
	ctx := r.Context()
	if failed != nil {
		ctx = context.WithValue(ctx, failedKey{}, failed)
	}
	out := r.Clone(ctx)
	out.Body = io.NopCloser(bytes.NewReader(body))
	out.ContentLength = int64(len(body))
	out.Header.Set("Content-Length", strconv.Itoa(len(body)))
	if failed != nil {
		// The response is rewritten, so it must come back uncompressed.
		out.Header.Del("Accept-Encoding")
	}
	p.rp.ServeHTTP(w, out)
}

// addFailed is the reverse proxy's ModifyResponse: it adds the entries
// partial took out to a successful batch response's Failed list.
func (p *Proxy) addFailed(resp *http.Response) error {
	failed, ok := resp.Request.Context().Value(failedKey{}).([]failedEntry)
	if !ok || resp.StatusCode != http.StatusOK {
		return nil
	}
	body, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if err != nil {
		return fmt.Errorf("faultproxy: reading the batch response: %w", err)
	}
	var out map[string]json.RawMessage
	if err := json.Unmarshal(body, &out); err != nil {
		return fmt.Errorf("faultproxy: batch response is not JSON: %w", err)
	}
	var all []json.RawMessage
	if f, ok := out["Failed"]; ok {
		if err := json.Unmarshal(f, &all); err != nil {
			return fmt.Errorf("faultproxy: batch response's Failed is not a list: %w", err)
		}
	}
	for _, f := range failed {
		b, _ := json.Marshal(f)
		all = append(all, b)
	}
	out["Failed"], _ = json.Marshal(all)
	body, _ = json.Marshal(out)
	resp.Body = io.NopCloser(bytes.NewReader(body))
	resp.ContentLength = int64(len(body))
	resp.Header.Set("Content-Length", strconv.Itoa(len(body)))
	action, _ := sqsAction(resp.Request)
	p.count(KindPartialBatch, action, 1)
	p.count(KindFailedEntry, action, int64(len(failed)))
	return nil
}
