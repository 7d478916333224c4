package subscriber

import (
	"errors"
	"net/http"

	smithyhttp "github.com/aws/smithy-go/transport/http"

	"github.com/vramq/vramq/internal/sqscodec"
)

// s3RefusalCodes are the error codes of S3 that refuse what was sent, not
// the moment it was sent in (SQS's are sqscodec.Refuses').
var s3RefusalCodes = []string{
	"EntityTooLarge",
	"KeyTooLongError",
	"InvalidArgument",
	"MetadataTooLarge",
	"InvalidRequest",
	"MalformedXML",
	"InvalidObjectName",
}

// refusedCode reports whether err carries a code of SQS or S3 that refuses
// what was sent for good.
func refusedCode(err error) bool {
	return sqscodec.Refuses(err) || sqscodec.HasCode(err, s3RefusalCodes...)
}

// permanent reports whether err refuses what was sent for good: an entry SQS
// blames on its sender, a code refusedCode knows, or an HTTP 413.
// Anything else (throttling, a 5xx, a timeout, access denied, which an
// operator may fix) may pass, and is retried later.
func permanent(err error) bool {
	if err == nil {
		return false
	}
	var ee *EntryError
	if errors.As(err, &ee) {
		// A failed entry is judged by its fault and its code alone.
		return !ee.Retryable() || refusedCode(ee)
	}
	if refusedCode(err) {
		return true
	}
	var re *smithyhttp.ResponseError
	return errors.As(err, &re) && re.HTTPStatusCode() == http.StatusRequestEntityTooLarge
}

// refusalCode names a permanent refusal in a reason: its error code, never
// its message, which may quote what was refused.
func refusalCode(err error) string {
	if c, ok := sqscodec.Code(err); ok {
		return c
	}
	var re *smithyhttp.ResponseError
	if errors.As(err, &re) {
		return http.StatusText(re.HTTPStatusCode())
	}
	return "refused"
}
