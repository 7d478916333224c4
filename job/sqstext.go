package job

import (
	"fmt"
	"time"
	"unicode/utf16"
	"unicode/utf8"
)

// SQS accepts in a body or an attribute value only the characters #x9, #xA,
// #xD, #x20 to #xD7FF, #xE000 to #xFFFD and #x10000 to #x10FFFF, and some
// SQS implementations (the fauxqs emulator among them) refuse everything
// above U+FFFF too. Whoever sends to the work queue chooses the ids and the
// text that come back in results and reasons, so everything vramq sends is
// written with these two functions, and nothing of it can be refused for a
// character.

// EncodeForSQS rewrites JSON b with every character above U+FFFD written as a
// JSON escape (U+FFFE and U+FFFF as \uXXXX, those above U+FFFF as a UTF-16
// surrogate pair). The escapes decode to the same string; control characters
// are already escaped by encoding/json. b is returned as is when nothing
// needs escaping, a new slice otherwise.
func EncodeForSQS(b []byte) []byte {
	i := firstAboveFFFD(b)
	if i < 0 {
		return b
	}
	out := make([]byte, 0, len(b)+64)
	out = append(out, b[:i]...)
	for rest := b[i:]; len(rest) > 0; {
		r, n := utf8.DecodeRune(rest)
		switch {
		case r == 0xFFFE || r == 0xFFFF:
			out = fmt.Appendf(out, `\u%04x`, r)
		case r > 0xFFFF:
			hi, lo := utf16.EncodeRune(r)
			out = fmt.Appendf(out, `\u%04x\u%04x`, hi, lo)
		default:
			out = append(out, rest[:n]...)
		}
		rest = rest[n:]
	}
	return out
}

// NeedsSQSEscape reports whether EncodeForSQS would change b.
func NeedsSQSEscape(b []byte) bool { return firstAboveFFFD(b) >= 0 }

// firstAboveFFFD is the index of the first rune of UTF-8 b at or above
// U+FFFE, or -1. It looks at bytes, not runes: such a rune starts with 0xF0
// or above (four bytes, beyond U+FFFF) or is EF BF BE / EF BF BF, and neither
// lead byte can be a continuation byte. Decoding every rune cost a third of
// planning a chunk of mostly ASCII JSON.
func firstAboveFFFD(b []byte) int {
	for i := 0; i < len(b); i++ {
		switch c := b[i]; {
		case c < 0xEF:
		case c >= 0xF0:
			return i
		case i+2 < len(b) && b[i+1] == 0xBF && b[i+2] >= 0xBE:
			return i
		}
	}
	return -1
}

// AttributeSafe returns s with every character SQS may refuse in an
// attribute value written as Go escapes: control characters other than tab,
// LF and CR as \xNN or \uXXXX, U+FFFE, U+FFFF and everything above U+FFFF as
// \uXXXX or \UXXXXXXXX, and bytes that are not UTF-8 as \xNN. Reasons quote
// ids and decoder errors, which the sender of a message chose.
func AttributeSafe(s string) string {
	ok := true
	for _, r := range s {
		if !attrRuneOK(r) {
			ok = false
			break
		}
	}
	if ok {
		return s
	}
	out := make([]byte, 0, len(s)+16)
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n == 1:
			out = fmt.Appendf(out, `\x%02x`, s[i])
		case attrRuneOK(r):
			out = append(out, s[i:i+n]...)
		case r < 0x80:
			out = fmt.Appendf(out, `\x%02x`, r)
		case r <= 0xFFFF:
			out = fmt.Appendf(out, `\u%04x`, r)
		default:
			out = fmt.Appendf(out, `\U%08x`, r)
		}
		i += n
	}
	return string(out)
}

func attrRuneOK(r rune) bool {
	switch {
	case r == '\t' || r == '\n' || r == '\r':
		return true
	case r < 0x20 || r == utf8.RuneError:
		// RuneError here is invalid UTF-8 (or a literal U+FFFD, which is
		// allowed but costs nothing to escape).
		return false
	case r >= 0xD800 && r <= 0xDFFF:
		return false
	}
	return r <= 0xFFFD
}

// SQS's limits, and the data type of vramq's attributes. These are the
// only definitions of them in vramq: every other package uses these.
const (
	MaxBatch        = 10       // entries in a batch call or a receive
	MinMessageBytes = 1 << 10  // a queue's MaximumMessageSize is from this
	MaxMessageBytes = 1 << 20  // to this (since August 2025; billed per 64 KiB)
	MaxBatchBytes   = 1 << 20  // a call's MessageSize in all, whatever the queue's; more is refused whole
	AttrDataType    = "String" // of every attribute vramq sends
)

// SQS's limits on time, from the SQS API reference: ReceiveMessage's
// WaitTimeSeconds, SendMessage's DelaySeconds and ChangeMessageVisibility's
// VisibilityTimeout ("the maximum is 12 hours", counted from the receive;
// an extension past it is refused). Each is set in whole seconds.
const (
	MaxLongPoll   = 20 * time.Second // the longest a receive waits for a message
	MaxDelay      = 15 * time.Minute // the longest a sent message stays invisible
	MaxVisibility = 12 * time.Hour   // the longest a received message stays invisible
)

// MessageSize is the size SQS counts, and limits a message and a call by:
// the body and each attribute's name, data type and value, in UTF-8 bytes.
func MessageSize(body string, attrs map[string]string) int {
	n := len(body)
	for k, v := range attrs {
		n += len(k) + len(AttrDataType) + len(v)
	}
	return n
}
