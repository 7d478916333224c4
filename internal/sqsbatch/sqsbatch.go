// Package sqsbatch reads the outcome of SQS batch calls entry by entry: a
// batch call can succeed as a whole while some of its entries fail, and
// those are listed in the response's Failed, not returned as an error.
package sqsbatch

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
)

// EntryError is one failed entry of a batch call.
type EntryError struct {
	Code        string
	Message     string
	SenderFault bool // SQS blames the entry itself: sending it again will not help
}

func (e *EntryError) Error() string { return fmt.Sprintf("sqs: %s: %s", e.Code, e.Message) }

// Retryable reports whether the entry may succeed if sent again. Entries SQS
// blames on the sender (a body it refuses, a bad attribute) fail the same way
// every time; the rest are SQS's own trouble.
func (e *EntryError) Retryable() bool { return !e.SenderFault }

// Errors maps a response's Failed list onto the request's n entries, whose
// ids must be their indexes ("0", "1", ...). An entry not listed succeeded:
// SQS gives no third state.
func Errors(n int, failed []types.BatchResultErrorEntry) ([]error, error) {
	errs := make([]error, n)
	for _, f := range failed {
		i, err := strconv.Atoi(aws.ToString(f.Id))
		if err != nil || i < 0 || i >= n {
			return nil, fmt.Errorf("sqs: batch response names unknown entry %q", aws.ToString(f.Id))
		}
		errs[i] = &EntryError{Code: aws.ToString(f.Code), Message: aws.ToString(f.Message), SenderFault: f.SenderFault}
	}
	return errs, nil
}

// Code returns an SQS error code in its plain form: some implementations put
// "AWS.SimpleQueueService." in front of the documented codes.
func Code(code string) string { return strings.TrimPrefix(code, "AWS.SimpleQueueService.") }
