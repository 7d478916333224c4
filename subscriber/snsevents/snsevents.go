// Package snsevents sends the subscriber's job completion events
// (subscriber.EventSink, docs/events.md) to an SNS topic.
package snsevents

import (
	"context"
	"fmt"
	"strconv"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sns"
	"github.com/aws/aws-sdk-go-v2/service/sns/types"

	"github.com/vramq/vramq/job"
)

// API is the part of *sns.Client a Topic uses.
type API interface {
	Publish(ctx context.Context, in *sns.PublishInput, opts ...func(*sns.Options)) (*sns.PublishOutput, error)
}

// Topic publishes to one SNS topic. Retries are the SDK's retryer's.
type Topic struct {
	api API
	arn string
}

func New(api API, topicARN string) *Topic { return &Topic{api: api, arn: topicARN} }

// Message attributes on every event, so that a subscription's filter
// policy can pick jobs, events, states or corrections without parsing the
// body: AttrJobID, AttrEvent (job.EventJobSettled), AttrStatus (complete,
// partial or cancelled) and AttrRevision (a Number: 1, then one more for
// each correction of the job's event).
const (
	AttrJobID    = "vramq-job-id"
	AttrEvent    = "vramq-event"
	AttrStatus   = "vramq-status"
	AttrRevision = "vramq-revision"
)

// Publish sends body, ev's JSON, to the topic.
func (t *Topic) Publish(ctx context.Context, ev *job.CompletionEvent, body []byte) error {
	str := func(v string) types.MessageAttributeValue {
		return types.MessageAttributeValue{DataType: aws.String("String"), StringValue: aws.String(v)}
	}
	_, err := t.api.Publish(ctx, &sns.PublishInput{
		TopicArn: aws.String(t.arn),
		Message:  aws.String(string(body)),
		MessageAttributes: map[string]types.MessageAttributeValue{
			AttrJobID:    str(ev.JobID),
			AttrEvent:    str(ev.Event),
			AttrStatus:   str(ev.Status),
			AttrRevision: {DataType: aws.String("Number"), StringValue: aws.String(strconv.Itoa(ev.Revision))},
		},
	})
	if err != nil {
		return fmt.Errorf("sns: publish to %s: %w", t.arn, err)
	}
	return nil
}
