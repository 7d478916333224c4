package snsevents

import (
	"context"
	"errors"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sns"
	"github.com/google/go-cmp/cmp"

	"github.com/vramq/vramq/job"
)

type fakeAPI struct {
	in  *sns.PublishInput
	err error
}

func (f *fakeAPI) Publish(ctx context.Context, in *sns.PublishInput, opts ...func(*sns.Options)) (*sns.PublishOutput, error) {
	f.in = in
	return &sns.PublishOutput{}, f.err
}

// The event's job, kind, state and revision ride as attributes, the
// revision as a Number, so that a filter policy can pick corrections
// ({"vramq-revision":[{"numeric":[">",1]}]}).
func TestPublishNamesTopicBodyAndAttributes(t *testing.T) {
	f := &fakeAPI{}
	const arn = "arn:aws:sns:us-east-1:123456789012:vramq-events"
	ev := &job.CompletionEvent{JobID: "j1", Event: job.EventJobSettled, Status: job.EventComplete, Revision: 2}
	if err := New(f, arn).Publish(t.Context(), ev, []byte(`{"job_id":"j1"}`)); err != nil {
		t.Fatal(err)
	}
	if aws.ToString(f.in.TopicArn) != arn || aws.ToString(f.in.Message) != `{"job_id":"j1"}` {
		t.Errorf("published %q to %q", aws.ToString(f.in.Message), aws.ToString(f.in.TopicArn))
	}
	got := map[string][2]string{}
	for k, v := range f.in.MessageAttributes {
		got[k] = [2]string{aws.ToString(v.DataType), aws.ToString(v.StringValue)}
	}
	want := map[string][2]string{AttrJobID: {"String", "j1"}, AttrEvent: {"String", "vramq.job.settled"},
		AttrStatus: {"String", "complete"}, AttrRevision: {"Number", "2"}}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("attributes (-want +got):\n%s", d)
	}
	f.err = errors.New("throttled")
	if err := New(f, arn).Publish(t.Context(), ev, nil); !errors.Is(err, f.err) {
		t.Errorf("error %v; want the API's, wrapped", err)
	}
}
