package sqsqueue

import (
	"errors"
	"fmt"
	"net/http"
	"testing"

	"github.com/aws/smithy-go"
	smithyhttp "github.com/aws/smithy-go/transport/http"

	"github.com/vramq/vramq/internal/sqscodec"
	"github.com/vramq/vramq/job/fault"
	"github.com/vramq/vramq/subscriber/queue"
)

// classify over each kind of error SQS gives: a failed batch entry, an API
// error in either spelling of its codes, a bare HTTP response, and an error
// with none of these. Those that are no queue kind but a job/fault one
// (throttled, needs an operator) come wrapped in it.
func TestClassify(t *testing.T) {
	status := func(code int) error {
		return &smithyhttp.ResponseError{
			Response: &smithyhttp.Response{Response: &http.Response{StatusCode: code}},
			Err:      errors.New("transport"),
		}
	}
	for _, tc := range []struct {
		err  error
		kind error // nil: returned as it is
		code string
	}{
		{&sqscodec.EntryError{Code: "InternalError", SenderFault: true}, queue.ErrRefused, "InternalError"},
		{&sqscodec.EntryError{Code: "AWS.SimpleQueueService.MessageTooLong"}, queue.ErrRefused, "MessageTooLong"},
		{fmt.Errorf("chunk 3: %w", &sqscodec.EntryError{Code: "InvalidMessageContents"}), queue.ErrRefused, "InvalidMessageContents"},
		{&sqscodec.EntryError{Code: "InternalError"}, nil, ""},
		{&sqscodec.EntryError{Code: "ReceiptHandleIsInvalid", SenderFault: true}, queue.ErrLeaseLost, "ReceiptHandleIsInvalid"},
		{&sqscodec.EntryError{Code: "AWS.SimpleQueueService.MessageNotInflight"}, queue.ErrLeaseLost, "MessageNotInflight"},
		{&smithy.GenericAPIError{Code: "InvalidReceiptHandle"}, queue.ErrLeaseLost, "InvalidReceiptHandle"},
		{&smithy.GenericAPIError{Code: "AWS.SimpleQueueService.BatchRequestTooLong"}, queue.ErrRefused, "BatchRequestTooLong"},
		{&smithy.GenericAPIError{Code: "InvalidParameterValue"}, queue.ErrRefused, "InvalidParameterValue"},
		{&smithy.GenericAPIError{Code: "ThrottlingException"}, fault.ErrBackoff, ""},
		{&smithy.GenericAPIError{Code: "AccessDenied"}, fault.ErrNeedsOperator, ""},
		{&smithy.GenericAPIError{Code: "AWS.SimpleQueueService.NonExistentQueue"}, fault.ErrNeedsOperator, ""},
		{status(http.StatusRequestEntityTooLarge), queue.ErrRefused, "Request Entity Too Large"},
		{status(http.StatusServiceUnavailable), nil, ""},
		{errors.New("timeout"), nil, ""},
	} {
		got := classify(tc.err)
		var qe *queue.Error
		switch {
		case tc.kind == nil && got != tc.err:
			t.Errorf("classify(%v) = %#v; want it as it is", tc.err, got)
		case tc.kind == fault.ErrBackoff || tc.kind == fault.ErrNeedsOperator:
			if !errors.Is(got, tc.kind) || !errors.Is(got, tc.err) || errors.As(got, &qe) {
				t.Errorf("classify(%v) = %#v; want it wrapped in %v, and no queue kind", tc.err, got, tc.kind)
			}
		case tc.kind != nil && (!errors.As(got, &qe) || qe.Kind != tc.kind || qe.Code != tc.code || !errors.Is(got, tc.err)):
			t.Errorf("classify(%v) = %#v; want kind %q, code %q, wrapping it", tc.err, got, tc.kind, tc.code)
		}
	}
}
