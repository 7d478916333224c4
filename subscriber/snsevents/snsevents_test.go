package snsevents

import (
	"context"
	"errors"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sns"
)

type fakeAPI struct {
	in  *sns.PublishInput
	err error
}

func (f *fakeAPI) Publish(ctx context.Context, in *sns.PublishInput, opts ...func(*sns.Options)) (*sns.PublishOutput, error) {
	f.in = in
	return &sns.PublishOutput{}, f.err
}

func TestPublishNamesTopicBodyAndJob(t *testing.T) {
	f := &fakeAPI{}
	const arn = "arn:aws:sns:us-east-1:123456789012:vramq-events"
	if err := New(f, arn).Publish(t.Context(), "j1", []byte(`{"job_id":"j1"}`)); err != nil {
		t.Fatal(err)
	}
	if aws.ToString(f.in.TopicArn) != arn || aws.ToString(f.in.Message) != `{"job_id":"j1"}` {
		t.Errorf("published %q to %q", aws.ToString(f.in.Message), aws.ToString(f.in.TopicArn))
	}
	if got := aws.ToString(f.in.MessageAttributes[AttrJobID].StringValue); got != "j1" {
		t.Errorf("%s attribute %q; want j1", AttrJobID, got)
	}
	f.err = errors.New("throttled")
	if err := New(f, arn).Publish(t.Context(), "j1", nil); !errors.Is(err, f.err) {
		t.Errorf("error %v; want the API's, wrapped", err)
	}
}
