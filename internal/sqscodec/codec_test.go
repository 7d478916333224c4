package sqscodec

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/aws/smithy-go"
	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/vramq/vramq/job/fault"
)

func TestEntriesAreIndexedAndCarryStringAttributes(t *testing.T) {
	got := Entries([]Message{
		{Body: "a", Attributes: map[string]string{"vramq-job-id": "j", "vramq-chunk": "3"}},
		{Body: "b"},
		{Body: "c", GroupID: "j", DedupID: "j-2"},
	})
	want := []types.SendMessageBatchRequestEntry{
		{Id: aws.String("0"), MessageBody: aws.String("a"), MessageAttributes: map[string]types.MessageAttributeValue{
			"vramq-job-id": {DataType: aws.String("String"), StringValue: aws.String("j")},
			"vramq-chunk":  {DataType: aws.String("String"), StringValue: aws.String("3")},
		}},
		{Id: aws.String("1"), MessageBody: aws.String("b")},
		{Id: aws.String("2"), MessageBody: aws.String("c"), MessageGroupId: aws.String("j"), MessageDeduplicationId: aws.String("j-2")},
	}
	if d := cmp.Diff(want, got, cmpopts.IgnoreUnexported(types.SendMessageBatchRequestEntry{}, types.MessageAttributeValue{})); d != "" {
		t.Errorf("entries (-want +got):\n%s", d)
	}
	if got[1].MessageAttributes != nil {
		t.Error("a message without attributes got an attribute map")
	}
}

func TestDeleteAndVisibilityEntries(t *testing.T) {
	d := DeleteEntries([]string{"h0", "h1"})
	v := VisibilityEntries([]string{"h0", "h1"}, 90*time.Second+500*time.Millisecond)
	for i := range 2 {
		if aws.ToString(d[i].Id) != fmt.Sprint(i) || aws.ToString(d[i].ReceiptHandle) != fmt.Sprint("h", i) {
			t.Errorf("delete entry %d: %+v", i, d[i])
		}
		if aws.ToString(v[i].Id) != fmt.Sprint(i) || aws.ToString(v[i].ReceiptHandle) != fmt.Sprint("h", i) || v[i].VisibilityTimeout != 90 {
			t.Errorf("visibility entry %d: %+v", i, v[i])
		}
	}
}

func TestStrings(t *testing.T) {
	got := Strings(map[string]types.MessageAttributeValue{
		"a": {DataType: aws.String("String"), StringValue: aws.String("x")},
		"b": {DataType: aws.String("Binary"), BinaryValue: []byte{1}},
	})
	if d := cmp.Diff(map[string]string{"a": "x"}, got); d != "" {
		t.Errorf("(-want +got):\n%s", d)
	}
	if Strings(nil) != nil {
		t.Error("no attributes gave a map")
	}
	if d := cmp.Diff(map[string]string{"k": "v"}, Strings(Attributes(map[string]string{"k": "v"}))); d != "" {
		t.Errorf("round trip (-want +got):\n%s", d)
	}
}

func TestErrorsMapsFailedEntriesByIndex(t *testing.T) {
	errs, err := Errors(3, []types.BatchResultErrorEntry{
		{Id: aws.String("2"), Code: aws.String("InvalidMessageContents"), Message: aws.String("bad"), SenderFault: true},
		{Id: aws.String("0"), Code: aws.String("InternalError"), Message: aws.String("oops")},
	})
	if err != nil {
		t.Fatal(err)
	}
	if errs[1] != nil {
		t.Errorf("entry 1 not listed, got %v", errs[1])
	}
	var e0, e2 *EntryError
	if !errors.As(errs[0], &e0) || e0.Code != "InternalError" || !e0.Retryable() {
		t.Errorf("entry 0: %v", errs[0])
	}
	if !errors.As(errs[2], &e2) || e2.Code != "InvalidMessageContents" || e2.Retryable() {
		t.Errorf("entry 2: %v", errs[2])
	}
	for _, id := range []string{"3", "-1", "x"} {
		if _, err := Errors(3, []types.BatchResultErrorEntry{{Id: aws.String(id)}}); err == nil {
			t.Errorf("id %q accepted for 3 entries", id)
		}
	}
}

func TestCodesInBothSpellings(t *testing.T) {
	for _, tc := range []struct {
		err       error
		code      string
		leaseLost bool
	}{
		{&EntryError{Code: "ReceiptHandleIsInvalid"}, "ReceiptHandleIsInvalid", true},
		{&EntryError{Code: "AWS.SimpleQueueService.MessageNotInflight"}, "MessageNotInflight", true},
		{fmt.Errorf("wrapped: %w", &smithy.GenericAPIError{Code: "InvalidReceiptHandle"}), "InvalidReceiptHandle", true},
		{&types.ReceiptHandleIsInvalid{Message: aws.String("gone")}, "ReceiptHandleIsInvalid", true},
		{&types.MessageNotInflight{}, "MessageNotInflight", true},
		{&EntryError{Code: "InvalidMessageContents"}, "InvalidMessageContents", false},
		{&smithy.GenericAPIError{Code: "AWS.SimpleQueueService.NonExistentQueue"}, "NonExistentQueue", false},
		{&types.QueueDoesNotExist{}, "QueueDoesNotExist", false},
	} {
		if c, ok := Code(tc.err); !ok || c != tc.code {
			t.Errorf("Code(%v) = %q, %v; want %q", tc.err, c, ok, tc.code)
		}
		if !HasCode(tc.err, "Other", tc.code) {
			t.Errorf("HasCode(%v, %q) false", tc.err, tc.code)
		}
		if LeaseLost(tc.err) != tc.leaseLost {
			t.Errorf("LeaseLost(%v) = %v", tc.err, !tc.leaseLost)
		}
	}
	if _, ok := Code(errors.New("plain")); ok || HasCode(errors.New("plain"), "") || LeaseLost(errors.New("ReceiptHandleIsInvalid")) {
		t.Error("an error without a code was given one")
	}
	if PlainCode("AWS.SimpleQueueService.X") != "X" || PlainCode("X") != "X" {
		t.Error("PlainCode")
	}
}

func TestRefuses(t *testing.T) {
	for _, tc := range []struct {
		err     error
		refuses bool
	}{
		{&EntryError{Code: "AWS.SimpleQueueService.MessageTooLong"}, true},
		{&EntryError{Code: "InvalidMessageContents"}, true},
		{fmt.Errorf("send: %w", &smithy.GenericAPIError{Code: "AWS.SimpleQueueService.BatchRequestTooLong"}), true},
		{&smithy.GenericAPIError{Code: "InvalidAttributeValue"}, true},
		{&EntryError{Code: "InternalError"}, false},
		{&smithy.GenericAPIError{Code: "ThrottlingException"}, false},
		{&smithy.GenericAPIError{Code: "EntityTooLarge"}, false}, // S3's, not SQS's
		{errors.New("MessageTooLong"), false},
	} {
		if got := Refuses(tc.err); got != tc.refuses {
			t.Errorf("Refuses(%v) = %v", tc.err, got)
		}
	}
}

// Kind over each kind SQS's codes fall in, for a failed entry and an API
// error, in either spelling; Classify keeps what SQS said reachable.
func TestKind(t *testing.T) {
	for _, tc := range []struct {
		err  error
		kind error // nil: none
	}{
		{&EntryError{Code: "InvalidMessageContents"}, fault.ErrInvalidInput},
		{&EntryError{Code: "InternalError", SenderFault: true}, fault.ErrInvalidInput},
		{&smithy.GenericAPIError{Code: "AWS.SimpleQueueService.BatchRequestTooLong"}, fault.ErrInvalidInput},
		{&EntryError{Code: "KmsThrottled"}, fault.ErrBackoff},
		{&smithy.GenericAPIError{Code: "AWS.SimpleQueueService.RequestThrottled"}, fault.ErrBackoff},
		{&smithy.GenericAPIError{Code: "ThrottlingException"}, fault.ErrBackoff},
		{&types.QueueDoesNotExist{}, fault.ErrNeedsOperator},
		{&smithy.GenericAPIError{Code: "AWS.SimpleQueueService.NonExistentQueue"}, fault.ErrNeedsOperator},
		{&EntryError{Code: "KmsDisabled"}, fault.ErrNeedsOperator},
		{&EntryError{Code: "KMS.DisabledException"}, fault.ErrNeedsOperator},
		{&smithy.GenericAPIError{Code: "KMS.ThrottlingException"}, fault.ErrBackoff},
		{&smithy.GenericAPIError{Code: "AccessDenied"}, fault.ErrNeedsOperator},
		{&smithy.GenericAPIError{Code: "InvalidClientTokenId"}, fault.ErrNeedsOperator},
		{&EntryError{Code: "ReceiptHandleIsInvalid", SenderFault: true}, nil},
		{&EntryError{Code: "InternalError"}, nil},
		{&smithy.GenericAPIError{Code: "ServiceUnavailable"}, nil},
		{errors.New("ThrottlingException"), nil},
	} {
		if got := Kind(tc.err); got != tc.kind {
			t.Errorf("Kind(%v) = %v; want %v", tc.err, got, tc.kind)
		}
		c := Classify(tc.err)
		if tc.kind != nil && !errors.Is(c, tc.kind) || !errors.Is(c, tc.err) {
			t.Errorf("Classify(%v) = %v; want it wrapping %v", tc.err, c, tc.kind)
		}
		for _, k := range []error{fault.ErrInvalidInput, fault.ErrBackoff, fault.ErrNeedsOperator} {
			if k != tc.kind && errors.Is(c, k) {
				t.Errorf("Classify(%v) = %v is %v too", tc.err, c, k)
			}
		}
	}
}
