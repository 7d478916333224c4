package job

import (
	"encoding/json"
	"strconv"
)

// The rule for a body of EndpointMessages, Anthropic's Messages API
// (https://docs.anthropic.com/en/api/messages, "Create a Message"): model a
// string and max_tokens an integer, both required (Anthropic has no default
// ceiling, so none is added); messages an array of at least one message,
// each an object whose content is a string or an array of content blocks;
// stream false or left out. What the rule adds is what CheckRequest adds to
// OpenAI's bodies: no key twice or in two cases, integer literals for what
// it bounds, and no remote URL a server would fetch (an image's or a
// document's source of type "url") unless remote URLs are allowed.

// blockFields are the keys of a content block the rule reads: its source, whose
// url a server fetches.
var blockFields = []string{"type", "source"}

// checkMessagesRequest finishes CheckRequest for EndpointMessages: r has its
// model checked, fields and members are the body's.
func checkMessagesRequest(r *Request, members []member, fields map[string]json.RawMessage, lim RequestLimits) (*Request, error) {
	v, ok := present(fields, "max_tokens")
	n, err := strconv.ParseInt(string(v), 10, 64)
	if !ok || err != nil || n < 1 || n > int64(lim.MaxOutputTokens) {
		return nil, bodyErr(ErrMaxTokens, "the body's max_tokens must be a whole number from 1 to %d: Anthropic's Messages API requires it", lim.MaxOutputTokens)
	}
	r.MaxOut = n
	v, ok = present(fields, "messages")
	if !ok {
		return nil, bodyErr(ErrBodyInvalid, "the body's messages must be an array of at least one message")
	}
	if err := checkMessages(v, lim.AllowRemoteURLs, checkBlock); err != nil {
		return nil, err
	}
	r.Messages = v
	r.Body = canonical(members, "", "")
	return r, nil
}

// checkBlock checks a content block: its source, where it has one, is read
// as an OpenAI content part is (checkPart), so that a source of type url
// names a data: URL unless remote URLs are allowed. A tool_result's content
// holds blocks of its own, checked the same way.
func checkBlock(b json.RawMessage, allowRemote bool) error {
	if len(b) == 0 || b[0] != '{' {
		return nil // not a block the rule reads; the server judges it
	}
	members, err := objectMembers(b, append(blockFields, "content"))
	if err != nil {
		return bodyErr(ErrBodyInvalid, "a content block of the body has a key more than once, or one the rule reads in another case")
	}
	for _, m := range members {
		switch {
		case m.key == "source":
			if err := checkPart(m.value, allowRemote); err != nil {
				return err
			}
		case m.key == "content" && m.value[0] == '[':
			var inner []json.RawMessage
			if json.Unmarshal(m.value, &inner) != nil {
				return bodyErr(ErrBodyInvalid, "a content block's content is not an array of blocks")
			}
			for _, ib := range inner {
				if err := checkBlock(ib, allowRemote); err != nil {
					return err
				}
			}
		}
	}
	return nil
}
