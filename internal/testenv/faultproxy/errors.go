package faultproxy

import (
	"encoding/json"
	"encoding/xml"
	"net/http"
	"strconv"
)

// SQS under the JSON protocol answers errors with a JSON body whose __type
// names the error, and, being query-compatible, an x-amzn-query-error header
// "Code;Sender|Receiver" that the SDK takes the error code from. S3 answers
// with an XML Error document.

// throttle answers as a throttled call. For SQS it is one of the two shapes
// SQS gives (the service-wide ThrottlingException and SQS's own
// RequestThrottled), picked at random; both codes are in the SDK retryer's
// throttle list (retry.DefaultThrottleErrorCodes), so the client backs off
// and retries. For S3 it is 503 SlowDown.
func (p *Proxy) throttle(w http.ResponseWriter, r *http.Request, sqs bool) {
	if !sqs {
		p.s3Error(w, r, http.StatusServiceUnavailable, "SlowDown", "Please reduce your request rate.")
		return
	}
	if p.coinFlip() {
		p.sqsError(w, http.StatusBadRequest, "com.amazon.coral.availability#ThrottlingException", "ThrottlingException;Sender", "Rate exceeded")
	} else {
		p.sqsError(w, http.StatusBadRequest, "com.amazonaws.sqs#RequestThrottled", "RequestThrottled;Sender", "Request is throttled.")
	}
}

// serverError answers as the service failing on its side.
func (p *Proxy) serverError(w http.ResponseWriter, r *http.Request, sqs bool) {
	if !sqs {
		p.s3Error(w, r, http.StatusInternalServerError, "InternalError", "We encountered an internal error. Please try again.")
		return
	}
	p.sqsError(w, http.StatusInternalServerError, "com.amazonaws.sqs#InternalError", "InternalError;Receiver",
		"Internal error (injected by faultproxy).")
}

func (p *Proxy) sqsError(w http.ResponseWriter, status int, typ, queryError, msg string) {
	body, _ := json.Marshal(map[string]string{"__type": typ, "message": msg})
	h := w.Header()
	h.Set("x-amzn-query-error", queryError)
	p.writeJSON(w, status, body)
}

func (p *Proxy) writeJSON(w http.ResponseWriter, status int, body []byte) {
	h := w.Header()
	h.Set("Content-Type", "application/x-amz-json-1.0")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	h.Set("x-amzn-RequestId", p.requestID())
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

func (p *Proxy) s3Error(w http.ResponseWriter, r *http.Request, status int, code, msg string) {
	id := p.requestID()
	body, _ := xml.Marshal(struct {
		XMLName   xml.Name `xml:"Error"`
		Code      string
		Message   string
		Resource  string
		RequestID string `xml:"RequestId"`
	}{Code: code, Message: msg, Resource: r.URL.Path, RequestID: id})
	body = append([]byte(xml.Header), body...)
	h := w.Header()
	h.Set("Content-Type", "application/xml")
	h.Set("x-amz-request-id", id)
	if r.Method != http.MethodHead { // a HEAD answer has no body; the SDK reads the status
		h.Set("Content-Length", strconv.Itoa(len(body)))
	}
	w.WriteHeader(status)
	if r.Method != http.MethodHead {
		_, _ = w.Write(body)
	}
}
