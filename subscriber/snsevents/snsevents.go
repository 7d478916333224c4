// Package snsevents sends the subscriber's job completion events
// (subscriber.EventSink, docs/events.md) to an SNS topic.
package snsevents

import (
	"context"
	"fmt"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sns"
	"github.com/aws/aws-sdk-go-v2/service/sns/types"
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

// AttrJobID and AttrEvent are message attributes on every event, so that a
// subscription's filter policy can pick jobs or events without parsing the
// body.
const (
	AttrJobID = "vramq-job-id"
	AttrEvent = "vramq-event"
)

// Publish sends body, a job.CompletionEvent's JSON, to the topic.
func (t *Topic) Publish(ctx context.Context, jobID string, body []byte) error {
	_, err := t.api.Publish(ctx, &sns.PublishInput{
		TopicArn: aws.String(t.arn),
		Message:  aws.String(string(body)),
		MessageAttributes: map[string]types.MessageAttributeValue{
			AttrJobID: {DataType: aws.String("String"), StringValue: aws.String(jobID)},
			AttrEvent: {DataType: aws.String("String"), StringValue: aws.String("vramq.job.settled")},
		},
	})
	if err != nil {
		return fmt.Errorf("sns: publish to %s: %w", t.arn, err)
	}
	return nil
}
