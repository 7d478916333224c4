package api

import (
	"bytes"
	"encoding/json"
	"mime"
	"net/http"
	"strings"
)

// CheckContentType accepts one Content-Type header of application/json,
// with no charset or UTF-8 (the only encoding JSON allows between systems,
// RFC 8259). Two headers are refused rather than the first one believed: a
// proxy or cache in front may have believed the other.
func CheckContentType(cts []string) *Error {
	switch len(cts) {
	case 0:
		return Err(http.StatusUnsupportedMediaType, CodeUnsupportedMedia, "Content-Type is missing; want application/json")
	case 1:
	default:
		return Err(http.StatusUnsupportedMediaType, CodeUnsupportedMedia, "Content-Type is given more than once; want one, application/json")
	}
	mt, params, err := mime.ParseMediaType(cts[0])
	if err != nil || mt != "application/json" {
		return Err(http.StatusUnsupportedMediaType, CodeUnsupportedMedia, "this Content-Type is not supported; want application/json")
	}
	if cs, ok := params["charset"]; ok && !strings.EqualFold(cs, "utf-8") {
		return Err(http.StatusUnsupportedMediaType, CodeUnsupportedMedia, "this charset is not supported; JSON is UTF-8")
	}
	return nil
}

// MarshalUnescaped is json.Marshal without its HTML escapes: an output's
// response is served as the subscriber stored it, and the escapes would
// rewrite every "<", ">" and "&" of a model server's answer (JSON raw values
// are only compacted then). The answer is application/json with nosniff,
// never HTML.
func MarshalUnescaped(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}
