package subscriber

import (
	"context"
	"errors"
	"time"

	"github.com/vramq/vramq/internal/payload"
	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/subscriber/queue"
)

// The subscriber reaches its queues and its bucket through these decorators,
// which count every call by outcome (vramq_subscriber_sqs_requests_total,
// vramq_subscriber_payload_requests_total) whatever implements them, so that
// the request counts hold for the in-memory fakes too.

// countedQueue counts every call by action and outcome, for any Queue.
type countedQueue struct {
	q queue.Queue
	m *metrics
}

func (c countedQueue) count(action string, err error) {
	outcome := "ok"
	if err != nil {
		outcome = "error"
	}
	c.m.requests.WithLabelValues(action, outcome).Inc()
}

func (c countedQueue) Receive(ctx context.Context, max int, wait, visibility time.Duration) ([]queue.Message, error) {
	msgs, err := c.q.Receive(ctx, max, wait, visibility)
	c.count("ReceiveMessage", err)
	return msgs, err
}

func (c countedQueue) Delete(ctx context.Context, handles []string) ([]error, error) {
	errs, err := c.q.Delete(ctx, handles)
	c.count("DeleteMessageBatch", err)
	return errs, err
}

func (c countedQueue) ChangeVisibility(ctx context.Context, handles []string, timeout time.Duration) ([]error, error) {
	errs, err := c.q.ChangeVisibility(ctx, handles, timeout)
	c.count("ChangeMessageVisibilityBatch", err)
	return errs, err
}

func (c countedQueue) Send(ctx context.Context, msgs []queue.Outgoing) ([]error, error) {
	return countedSender{c.q, c.m}.Send(ctx, msgs)
}

type countedSender struct {
	s queue.Sender
	m *metrics
}

func (c countedSender) Send(ctx context.Context, msgs []queue.Outgoing) ([]error, error) {
	errs, err := c.s.Send(ctx, msgs)
	countedQueue{m: c.m}.count("SendMessageBatch", err)
	return errs, err
}

// countedPayloads counts every payload bucket operation by outcome.
type countedPayloads struct {
	p Payloads
	m *metrics
}

func (c countedPayloads) count(op string, err error) {
	outcome := "ok"
	if err != nil {
		outcome = "error"
	}
	c.m.payloadRequests.WithLabelValues(op, outcome).Inc()
}

func (c countedPayloads) Bucket() string { return c.p.Bucket() }

func (c countedPayloads) Get(ctx context.Context, ref job.PayloadRef) ([]byte, error) {
	b, err := c.p.Get(ctx, ref)
	c.count("get", err)
	return b, err
}

func (c countedPayloads) Put(ctx context.Context, key string, body []byte) (job.PayloadRef, error) {
	ref, err := c.p.Put(ctx, key, body)
	c.count("put", err)
	return ref, err
}

func (c countedPayloads) Read(ctx context.Context, key string) ([]byte, error) {
	b, err := c.p.Read(ctx, key)
	if errors.Is(err, payload.ErrMissing) {
		c.count("read", nil) // an answer: the object is not there
	} else {
		c.count("read", err)
	}
	return b, err
}

func (c countedPayloads) PutIfAbsent(ctx context.Context, key string, body []byte) (bool, []byte, error) {
	created, existing, err := c.p.PutIfAbsent(ctx, key, body)
	c.count("put_if_absent", err)
	return created, existing, err
}

func (c countedPayloads) Create(ctx context.Context, key string, body []byte) (bool, []byte, error) {
	created, existing, err := c.p.Create(ctx, key, body)
	c.count("create", err)
	return created, existing, err
}
