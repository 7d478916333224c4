package subscriber

import (
	"errors"
	"net/http"

	"github.com/aws/smithy-go"
	smithyhttp "github.com/aws/smithy-go/transport/http"

	"github.com/vramq/vramq/internal/sqscodec"
)

// permanentCodes are the error codes of SQS and S3 that refuse what was
// sent, not the moment it was sent in: sending the same thing again fails
// the same way. Codes of SQS are matched in both their plain and their
// "AWS.SimpleQueueService." forms.
var permanentCodes = map[string]bool{
	// SQS
	"InvalidMessageContents": true, // a character SQS does not accept
	"MessageTooLong":         true,
	"BatchRequestTooLong":    true,
	"InvalidParameterValue":  true,
	"InvalidAttributeName":   true,
	"InvalidAttributeValue":  true,
	// S3
	"EntityTooLarge":    true,
	"KeyTooLongError":   true,
	"InvalidArgument":   true,
	"MetadataTooLarge":  true,
	"InvalidRequest":    true,
	"MalformedXML":      true,
	"InvalidObjectName": true,
}

// permanent reports whether err refuses what was sent for good: an entry SQS
// blames on its sender, an error code of permanentCodes, or an HTTP 413.
// Anything else (throttling, a 5xx, a timeout, access denied, which an
// operator may fix) may pass, and is retried later.
func permanent(err error) bool {
	if err == nil {
		return false
	}
	var ee *EntryError
	if errors.As(err, &ee) {
		return !ee.Retryable() || permanentCodes[sqscodec.PlainCode(ee.Code)]
	}
	var apiErr smithy.APIError
	if errors.As(err, &apiErr) && permanentCodes[sqscodec.PlainCode(apiErr.ErrorCode())] {
		return true
	}
	var re *smithyhttp.ResponseError
	return errors.As(err, &re) && re.HTTPStatusCode() == http.StatusRequestEntityTooLarge
}

// refusalCode names a permanent refusal in a reason: its error code, never
// its message, which may quote what was refused.
func refusalCode(err error) string {
	var ee *EntryError
	if errors.As(err, &ee) {
		return sqscodec.PlainCode(ee.Code)
	}
	var apiErr smithy.APIError
	if errors.As(err, &apiErr) {
		return sqscodec.PlainCode(apiErr.ErrorCode())
	}
	var re *smithyhttp.ResponseError
	if errors.As(err, &re) {
		return http.StatusText(re.HTTPStatusCode())
	}
	return "refused"
}
