package subscriber

import (
	"errors"
	"fmt"
	"net/http"
	"testing"

	"github.com/aws/smithy-go"
	smithyhttp "github.com/aws/smithy-go/transport/http"
)

// permanent and refusalCode over each kind of error the stores return: a
// failed batch entry, an API error of SQS or S3 (in either spelling of SQS's
// codes), a bare HTTP response, and an error with none of these.
func TestPermanentAndRefusalCode(t *testing.T) {
	status := func(code int) error {
		return &smithyhttp.ResponseError{
			Response: &smithyhttp.Response{Response: &http.Response{StatusCode: code}},
			Err:      errors.New("transport"),
		}
	}
	for _, tc := range []struct {
		err       error
		permanent bool
		code      string
	}{
		{&EntryError{Code: "InternalError", SenderFault: true}, true, "InternalError"},
		{&EntryError{Code: "AWS.SimpleQueueService.MessageTooLong"}, true, "MessageTooLong"},
		{fmt.Errorf("chunk 3: %w", &EntryError{Code: "InvalidMessageContents"}), true, "InvalidMessageContents"},
		{&EntryError{Code: "InternalError"}, false, "InternalError"},
		{&EntryError{Code: "EntityTooLarge"}, true, "EntityTooLarge"},
		{&smithy.GenericAPIError{Code: "AWS.SimpleQueueService.BatchRequestTooLong"}, true, "BatchRequestTooLong"},
		{&smithy.GenericAPIError{Code: "InvalidParameterValue"}, true, "InvalidParameterValue"},
		{fmt.Errorf("put: %w", &smithy.GenericAPIError{Code: "EntityTooLarge"}), true, "EntityTooLarge"},
		{&smithy.GenericAPIError{Code: "KeyTooLongError"}, true, "KeyTooLongError"},
		{&smithy.GenericAPIError{Code: "MalformedXML"}, true, "MalformedXML"},
		{&smithy.GenericAPIError{Code: "ThrottlingException"}, false, "ThrottlingException"},
		{&smithy.GenericAPIError{Code: "AccessDenied"}, false, "AccessDenied"},
		{status(http.StatusRequestEntityTooLarge), true, "Request Entity Too Large"},
		{status(http.StatusServiceUnavailable), false, "Service Unavailable"},
		{errors.New("timeout"), false, "refused"},
		{nil, false, "refused"},
	} {
		if got := permanent(tc.err); got != tc.permanent {
			t.Errorf("permanent(%v) = %v", tc.err, got)
		}
		if got := refusalCode(tc.err); got != tc.code {
			t.Errorf("refusalCode(%v) = %q; want %q", tc.err, got, tc.code)
		}
	}
}
