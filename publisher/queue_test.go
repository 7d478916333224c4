package publisher_test

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/vramq/vramq/job/fault"
	"github.com/vramq/vramq/publisher/jobs"
)

// TestSQSQueueClassifiesCallErrors: a SendMessageBatch that SQS refuses as
// a whole comes back wrapping its kind (job/fault), with SQS's own error
// still there, as SQS sends it: an AWS JSON error body, with the query
// protocol's code in x-amzn-query-error (SQS API reference, "Common
// Errors" and each action's Errors; the JSON protocol's error shape).
func TestSQSQueueClassifiesCallErrors(t *testing.T) {
	for _, tc := range []struct {
		typ, queryCode string
		status         int
		kind           error
	}{
		{"com.amazonaws.sqs#QueueDoesNotExist", "AWS.SimpleQueueService.NonExistentQueue;Sender", 400, fault.ErrNeedsOperator},
		{"com.amazonaws.sqs#QueueDoesNotExist", "", 400, fault.ErrNeedsOperator},
		{"com.amazonaws.sqs#KmsAccessDenied", "KMS.AccessDeniedException;Sender", 400, fault.ErrNeedsOperator},
		{"com.amazonaws.sqs#RequestThrottled", "RequestThrottled;Sender", 400, fault.ErrBackoff},
		{"com.amazonaws.sqs#BatchRequestTooLong", "AWS.SimpleQueueService.BatchRequestTooLong;Sender", 400, fault.ErrInvalidInput},
		{"com.amazonaws.sqs#InternalError", "", 500, nil},
	} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/x-amz-json-1.0")
			if tc.queryCode != "" {
				w.Header().Set("x-amzn-query-error", tc.queryCode)
			}
			w.WriteHeader(tc.status)
			_, _ = w.Write([]byte(`{"__type":"` + tc.typ + `","message":"injected"}`))
		}))
		c := sqs.New(sqs.Options{Region: "us-east-1", BaseEndpoint: aws.String(srv.URL),
			Credentials: aws.AnonymousCredentials{}, RetryMaxAttempts: 1})
		q := jobs.NewSQSQueue(c, "https://sqs.us-east-1.amazonaws.com/1/work")
		_, err := q.SendBatch(t.Context(), []jobs.Entry{{Body: "b", JobID: "j", Chunk: 0}})
		srv.Close()
		for _, k := range []error{fault.ErrInvalidInput, fault.ErrBackoff, fault.ErrNeedsOperator} {
			if errors.Is(err, k) != (k == tc.kind) {
				t.Errorf("%s (%q): %v; want kind %v", tc.typ, tc.queryCode, err, tc.kind)
			}
		}
		if tc.typ == "com.amazonaws.sqs#QueueDoesNotExist" && tc.queryCode == "" {
			var qdne *types.QueueDoesNotExist
			if !errors.As(err, &qdne) {
				t.Errorf("%v: SQS's own error is lost", err)
			}
		}
	}
}
