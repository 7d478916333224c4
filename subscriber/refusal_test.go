package subscriber

import (
	"errors"
	"fmt"
	"testing"

	"github.com/aws/smithy-go"

	"github.com/vramq/vramq/subscriber/queue"
)

// permanent and refusalCode go by the kind and code the queue or the bucket
// gave an error, wrapped or not, and never by a provider's own error: an
// unclassified EntityTooLarge may pass (sqsqueue's and payload's tests
// check that they classify their services' codes).
func TestPermanentAndRefusalCode(t *testing.T) {
	for _, tc := range []struct {
		err       error
		permanent bool
		code      string
	}{
		{&queue.Error{Kind: queue.ErrRefused, Code: "InvalidMessageContents"}, true, "InvalidMessageContents"},
		{fmt.Errorf("put: %w", &queue.Error{Kind: queue.ErrRefused, Code: "EntityTooLarge", Err: errors.New("s3")}), true, "EntityTooLarge"},
		{&queue.Error{Kind: queue.ErrRefused}, true, "refused"},
		{&queue.Error{Kind: queue.ErrLeaseLost, Code: "ReceiptHandleIsInvalid"}, false, "ReceiptHandleIsInvalid"},
		{&smithy.GenericAPIError{Code: "EntityTooLarge"}, false, "refused"},
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
