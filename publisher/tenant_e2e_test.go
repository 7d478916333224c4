package publisher_test

import (
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/publisher"
	"github.com/vramq/vramq/publisher/api"
)

// TestTenantOnStandardQueue: on the emulator, a standard queue takes work
// messages sent with MessageGroupId = tenant (it does not refuse them as
// FIFO-only), and the receiver finds the tenant in vramq-tenant. fauxqs
// 2.4.1 drops a standard queue's MessageGroupId (sendMessageBatch.js keeps
// it for FIFO queues only), so the group id is not seen again here; where
// an emulator or SQS returns it, it must be the tenant. That the request
// carries it is TestSQSQueueTenantGroup's to show.
func TestTenantOnStandardQueue(t *testing.T) {
	e := newEnv(t, false)
	s := e.serve(publisher.Config{})
	a := s.mustPost(jobBody(t, manyItems("t-", 3, 2), 1), map[string]string{api.TenantHeader: "acme"})
	groups := map[string]int{}
	attrs := map[string]int{}
	for n, got := 0, 0; n < 20 && got < a.Chunks; n++ {
		r, err := e.client.ReceiveMessage(t.Context(), &sqs.ReceiveMessageInput{QueueUrl: &e.urls.Work, MaxNumberOfMessages: 10,
			WaitTimeSeconds: 1, MessageAttributeNames: []string{"All"},
			MessageSystemAttributeNames: []types.MessageSystemAttributeName{types.MessageSystemAttributeNameMessageGroupId}})
		if err != nil {
			t.Fatal(err)
		}
		got += len(r.Messages)
		for _, m := range r.Messages {
			groups[m.Attributes[string(types.MessageSystemAttributeNameMessageGroupId)]]++
			attrs[aws.ToString(m.MessageAttributes[job.AttrTenant].StringValue)]++
		}
	}
	t.Logf("chunks %d, MessageGroupId seen %v, %s seen %v", a.Chunks, groups, job.AttrTenant, attrs)
	if attrs["acme"] != a.Chunks || groups["acme"]+groups[""] != a.Chunks {
		t.Errorf("chunks %d, MessageGroupId seen %v, %s seen %v", a.Chunks, groups, job.AttrTenant, attrs)
	}
}
