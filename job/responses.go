package job

import (
	"encoding/json"
	"errors"
	"strconv"
)

// The rules for bodies of EndpointResponses and EndpointModerations, from
// OpenAI's API reference ("Create a model response",
// https://platform.openai.com/docs/api-reference/responses/create, and
// "Create moderation", .../moderations/create; schemas CreateResponse and
// CreateModerationRequest of github.com/openai/openai-openapi):
//   - a response's input is a string or an array of input items (messages
//     whose content is a string or an array of parts, and items of other
//     types); max_output_tokens an integer; stream and background booleans;
//   - a moderation's input is a string, an array of strings, or an array of
//     multi-modal parts (text, image_url); model is optional there.
//
// What the rules add, and why:
//   - model is required for both: a deployment serves its models by name,
//     and -models can bound only a model that is named.
//   - background must be false or left out: a background response answers
//     at once, queued, and its result would have to be fetched later; a
//     batch's line is the server's whole answer.
//   - max_output_tokens is bounded as max_tokens is, and added at
//     RequestLimits.MaxOutputTokens where the body names none, so that what
//     a response may generate is known before it is sent (vLLM generates up
//     to the context length without it).
//   - A part naming a URL (input_image's image_url, input_file's file_url,
//     a moderation's image_url) must be a data: URL unless remote URLs are
//     allowed: the server would fetch it.

// checkResponsesRequest finishes CheckRequest for EndpointResponses: r has
// its model and stream checked, fields and members are the body's.
func checkResponsesRequest(r *Request, members []member, fields map[string]json.RawMessage, lim RequestLimits) (*Request, error) {
	if v, ok := present(fields, "background"); ok && string(v) != "false" {
		return nil, bodyErr(ErrBodyInvalid, "background must be false or left out: an output is the server's whole answer, not a response to fetch later")
	}
	add := ""
	r.MaxOut = int64(lim.MaxOutputTokens)
	if v, ok := present(fields, "max_output_tokens"); ok {
		n, err := strconv.ParseInt(string(v), 10, 64)
		if err != nil || n < 1 || n > int64(lim.MaxOutputTokens) {
			return nil, bodyErr(ErrMaxTokens, "the body's max_output_tokens must be a whole number from 1 to %d, or left out", lim.MaxOutputTokens)
		}
		r.MaxOut = n
	} else {
		add = strconv.FormatInt(r.MaxOut, 10)
	}
	v, ok := present(fields, "input")
	bad := bodyErr(ErrBodyInvalid, "the body's input must be a string that is not empty, or an array of at least one input item")
	switch {
	case !ok:
		return nil, bad
	case v[0] == '"':
		var s string
		if json.Unmarshal(v, &s) != nil || s == "" {
			return nil, bad
		}
	default:
		if err := checkMessages(v, lim.AllowRemoteURLs, checkPart); err != nil {
			if errors.Is(err, ErrRemoteURL) {
				return nil, err
			}
			return nil, bad
		}
	}
	r.Input = v
	r.Body = canonical(members, "max_output_tokens", add)
	return r, nil
}

// checkModerationsRequest finishes CheckRequest for EndpointModerations.
func checkModerationsRequest(r *Request, members []member, fields map[string]json.RawMessage, lim RequestLimits) (*Request, error) {
	v, ok := present(fields, "input")
	bad := bodyErr(ErrBodyInvalid, "the body's input must be a string that is not empty, or an array of at least one string or content part")
	if !ok {
		return nil, bad
	}
	if v[0] == '"' {
		var s string
		if json.Unmarshal(v, &s) != nil || s == "" {
			return nil, bad
		}
	} else {
		var parts []json.RawMessage
		if v[0] != '[' || json.Unmarshal(v, &parts) != nil || len(parts) == 0 {
			return nil, bad
		}
		for _, p := range parts {
			switch p[0] {
			case '"':
			case '{':
				if err := checkPart(p, lim.AllowRemoteURLs); err != nil {
					return nil, err
				}
			default:
				return nil, bad
			}
		}
	}
	r.Input = v
	r.Body = canonical(members, "", "")
	return r, nil
}
