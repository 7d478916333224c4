package job

import (
	"errors"
	"fmt"
	"unicode"
	"unicode/utf8"
)

// The id grammar. Both the publisher (the ids it mints and accepts) and the
// subscriber (every work message it decodes) check ids with these functions
// and no others, because whoever can send to the work queue chooses them and
// they end up in S3 keys, message attributes and failure reasons.
//
// A job id is 1 to MaxJobIDBytes ASCII letters, digits, '-' or '_'. It
// names S3 keys (results/{job_id}/{chunk}.json): no '/', '.', or
// anything a key, an attribute value or a FIFO message group id would have
// to escape. The publisher mints 32 lower-case hex digits, one case of it.
//
// An item id is 1 to MaxItemIDBytes bytes of UTF-8 without control
// characters (Unicode Cc: U+0000-U+001F, U+007F-U+009F). Item ids never
// name a key (claim-checked items are named by their index in the job), so
// other characters are allowed; results carry them JSON-escaped where SQS
// would refuse them raw (EncodeForSQS), reasons quote them with QuoteID.
const (
	MaxJobIDBytes  = 64
	MaxItemIDBytes = 256
)

// Errors of the id grammar and the item rule, wrapped by CheckJobID,
// CheckItemID and Item.Check so callers can tell them apart (the publisher
// answers each with its own error code).
var (
	ErrEmptyID   = errors.New("empty id")
	ErrIDTooLong = errors.New("id too long")
	ErrIDChars   = errors.New("id has characters outside its grammar")
	ErrEmptyItem = errors.New("item has neither text nor data")
	ErrMixedItem = errors.New("item has both a payload reference and inline content")
)

// CheckJobID reports what breaks the job id grammar, nil if nothing. The
// error never quotes the id: it may be anything.
func CheckJobID(id string) error {
	switch {
	case id == "":
		return ErrEmptyID
	case len(id) > MaxJobIDBytes:
		return fmt.Errorf("%w: %d bytes, at most %d", ErrIDTooLong, len(id), MaxJobIDBytes)
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; !('0' <= c && c <= '9' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || c == '-' || c == '_') {
			return fmt.Errorf("%w: byte %d is not a letter, digit, '-' or '_'", ErrIDChars, i)
		}
	}
	return nil
}

// ValidJobID reports whether id is a job id of the grammar.
func ValidJobID(id string) bool { return CheckJobID(id) == nil }

// CheckItemID reports what breaks the item id grammar, nil if nothing. The
// error never quotes the id.
func CheckItemID(id string) error {
	switch {
	case id == "":
		return ErrEmptyID
	case len(id) > MaxItemIDBytes:
		return fmt.Errorf("%w: %d bytes, at most %d", ErrIDTooLong, len(id), MaxItemIDBytes)
	}
	if !utf8.ValidString(id) {
		return fmt.Errorf("%w: invalid UTF-8", ErrIDChars)
	}
	for i, r := range id {
		if unicode.IsControl(r) {
			return fmt.Errorf("%w: a control character (U+%04X) at byte %d", ErrIDChars, r, i)
		}
	}
	return nil
}

// Check applies the rule every item of a job without an endpoint obeys, on
// both sides of the queue: CheckFor("").
func (it *Item) Check() error { return it.CheckFor("") }

// CheckFor applies the rule every item of a job with this endpoint ("" for
// none) obeys, on both sides of the queue: its id is of the grammar, and it
// has content, inline or a payload reference instead (never both, and never
// neither). Inline content is text or data without an endpoint, a request
// body (a JSON object) with one, and never the other kind. Errors wrap
// ErrMalformed and one of the errors above or of endpoint.go.
func (it *Item) CheckFor(endpoint string) error {
	if err := CheckItemID(it.ID); err != nil {
		return fmt.Errorf("%w: item id: %w", ErrMalformed, err)
	}
	if endpoint != "" && !ValidEndpoint(endpoint) {
		return fmt.Errorf("%w: %w", ErrMalformed, ErrUnknownEndpoint)
	}
	text := it.Text != "" || len(it.Data) > 0
	body := len(it.Body) > 0
	switch {
	case endpoint == "" && body:
		return fmt.Errorf("%w: item %s: %w", ErrMalformed, QuoteID(it.ID), ErrBodyWithoutEndpoint)
	case endpoint != "" && text:
		return fmt.Errorf("%w: item %s: %w", ErrMalformed, QuoteID(it.ID), ErrInlineWithEndpoint)
	case it.Ref != nil && (text || body):
		return fmt.Errorf("%w: item %s: %w", ErrMalformed, QuoteID(it.ID), ErrMixedItem)
	case it.Ref != nil:
		if err := it.Ref.Validate(); err != nil {
			return fmt.Errorf("item %s: %w", QuoteID(it.ID), err)
		}
	case endpoint == "" && !text:
		return fmt.Errorf("%w: item %s: %w", ErrMalformed, QuoteID(it.ID), ErrEmptyItem)
	case endpoint != "" && !body:
		return fmt.Errorf("%w: item %s: %w", ErrMalformed, QuoteID(it.ID), ErrNoBody)
	case endpoint != "" && !isJSONObject(it.Body):
		return fmt.Errorf("%w: item %s: %w", ErrMalformed, QuoteID(it.ID), ErrBodyNotObject)
	}
	return nil
}

// QuoteID quotes an id for a reason or a log line: as strconv.Quote, and
// with every character SQS refuses in an attribute value escaped too (see
// AttributeSafe), so a reason that quotes it can always be sent.
func QuoteID(id string) string {
	return AttributeSafe(fmt.Sprintf("%q", id))
}
