package sqscodec

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/aws/smithy-go"

	"github.com/vramq/vramq/job/fault"
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

// Unwrap is the entry's kind of failure (Kind): a failed entry is
// classified where it is read, whoever reads it.
func (e *EntryError) Unwrap() error {
	return kind(PlainCode(e.Code), e.SenderFault)
}

// Errors maps a response's Failed list onto the request's n entries, whose
// ids must be their indexes ("0", "1", ...), as the entry builders of this
// package make them. An entry not listed succeeded: SQS gives no third state.
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

// queryPrefix is what the SQS query protocol, and emulators that speak its
// codes over JSON, put in front of the documented codes
// ("AWS.SimpleQueueService.NonExistentQueue").
const queryPrefix = "AWS.SimpleQueueService."

// PlainCode returns an SQS error code in its plain form, without queryPrefix.
func PlainCode(code string) string { return strings.TrimPrefix(code, queryPrefix) }

// Code returns the plain error code err carries, from a failed batch entry
// (an *EntryError) or from an API error of any AWS service, and whether it
// carries one.
func Code(err error) (string, bool) {
	var ee *EntryError
	if errors.As(err, &ee) {
		return PlainCode(ee.Code), true
	}
	var apiErr smithy.APIError
	if errors.As(err, &apiErr) {
		return PlainCode(apiErr.ErrorCode()), true
	}
	return "", false
}

// HasCode reports whether err carries one of codes (plain forms), in either
// spelling.
func HasCode(err error, codes ...string) bool {
	c, ok := Code(err)
	if !ok {
		return false
	}
	for _, want := range codes {
		if c == want {
			return true
		}
	}
	return false
}

// leaseLostCodes are the codes that mean a receipt handle no longer holds
// its message: the SDK's own names for them, and InvalidReceiptHandle, which
// SQS's API reference lists for DeleteMessage and ChangeMessageVisibility
// without the SDK modelling it.
var leaseLostCodes = []string{
	(*types.ReceiptHandleIsInvalid)(nil).ErrorCode(),
	(*types.MessageNotInflight)(nil).ErrorCode(),
	"InvalidReceiptHandle",
}

// LeaseLost reports whether err, a failed entry or an API error, says that
// the receipt handle it was given no longer holds its message: the message
// was deleted, or its visibility lapsed and it may be with another consumer.
func LeaseLost(err error) bool { return HasCode(err, leaseLostCodes...) }

// refusalCodes are the codes by which SQS refuses what was sent, not the
// moment it was sent in: sending the same thing again fails the same way.
var refusalCodes = []string{
	"InvalidMessageContents", // a character SQS does not accept
	"MessageTooLong",
	"BatchRequestTooLong",
	"InvalidParameterValue",
	"InvalidAttributeName",
	"InvalidAttributeValue",
}

// Refuses reports whether err, a failed entry or an API error, carries a
// code by which SQS refuses what was sent for good (in either spelling).
func Refuses(err error) bool { return HasCode(err, refusalCodes...) }

// throttleCodes are the codes by which SQS, or the KMS key it encrypts
// with, refuses the rate of requests rather than what they carry: the same
// request later may succeed. SendMessageBatch's API reference lists
// RequestThrottled and KmsThrottled; ThrottlingException is AWS's common
// error (Common Errors, SQS API reference). The SDK's retryer has retried
// them already by the time they are read here.
var throttleCodes = []string{
	(*types.RequestThrottled)(nil).ErrorCode(),
	(*types.KmsThrottled)(nil).ErrorCode(), "KMS.ThrottlingException",
	"ThrottlingException",
}

// operatorCodes are the codes by which nothing sent to the queue can
// succeed until a person changes the setup: the queue, its encryption key,
// its policy or the credentials (SendMessageBatch's errors and AWS's common
// ones, SQS API reference). The second spelling of a code is the query
// protocol's, which SQS sends in x-amzn-query-error and emulators send as
// the code (the SDK's service model lists them: NonExistentQueue for
// QueueDoesNotExist, KMS.DisabledException for KmsDisabled, ...).
var operatorCodes = []string{
	(*types.QueueDoesNotExist)(nil).ErrorCode(), "NonExistentQueue",
	(*types.InvalidAddress)(nil).ErrorCode(),
	(*types.InvalidSecurity)(nil).ErrorCode(),
	(*types.UnsupportedOperation)(nil).ErrorCode(),
	(*types.KmsAccessDenied)(nil).ErrorCode(), "KMS.AccessDeniedException",
	(*types.KmsDisabled)(nil).ErrorCode(), "KMS.DisabledException",
	(*types.KmsInvalidKeyUsage)(nil).ErrorCode(), "KMS.InvalidKeyUsageException",
	(*types.KmsInvalidState)(nil).ErrorCode(), "KMS.InvalidStateException",
	(*types.KmsNotFound)(nil).ErrorCode(), "KMS.NotFoundException",
	(*types.KmsOptInRequired)(nil).ErrorCode(), "KMS.OptInRequired",
	"AccessDenied", "AccessDeniedException", "InvalidClientTokenId", "UnrecognizedClientException",
	"SignatureDoesNotMatch", "IncompleteSignature", "ExpiredToken", "MissingAuthenticationToken",
	"OptInRequired", "NotAuthorized",
}

// Kind returns the kind of failure (job/fault) err, a failed entry or an
// API error, is by its code: fault.ErrInvalidInput where SQS refuses what
// was sent for good (Refuses, or an entry it blames on the sender),
// fault.ErrBackoff where it refuses the rate, fault.ErrNeedsOperator where
// nothing will succeed until the setup changes. It is nil for a lost
// lease (the subscriber's own kind) and for every other error: SQS's own
// trouble, a broken connection, which sending again may mend.
func Kind(err error) error {
	code, ok := Code(err)
	if !ok {
		return nil
	}
	var ee *EntryError
	return kind(code, errors.As(err, &ee) && ee.SenderFault)
}

func kind(code string, senderFault bool) error {
	switch {
	case slices.Contains(leaseLostCodes, code):
		return nil
	case slices.Contains(throttleCodes, code):
		return fault.ErrBackoff
	case slices.Contains(operatorCodes, code):
		return fault.ErrNeedsOperator
	case slices.Contains(refusalCodes, code), senderFault:
		return fault.ErrInvalidInput
	}
	return nil
}

// Classify returns err wrapped in its Kind, so that errors.Is finds the
// kind and errors.As still finds what SQS said; err as it is where it has
// no kind, or already is one.
func Classify(err error) error {
	k := Kind(err)
	if k == nil || errors.Is(err, k) {
		return err
	}
	return fmt.Errorf("%w: %w", k, err)
}
