package sqsqueue_test

import (
	"testing"

	"github.com/vramq/vramq/internal/testenv/sqstest"
	"github.com/vramq/vramq/subscriber/queuetest"
	"github.com/vramq/vramq/subscriber/sqsqueue"
)

// On the emulator make test starts, or on whatever AWS_ENDPOINT_URL names;
// skipped without one.
func TestConformance(t *testing.T) {
	queuetest.RunConformance(t, func(t *testing.T) queuetest.QueueSender {
		client := sqstest.Client(t)
		return sqsqueue.New(client, sqstest.Queues(t, client, 5).Work)
	})
}
