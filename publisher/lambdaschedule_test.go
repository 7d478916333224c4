package publisher_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"testing"

	"github.com/aws/aws-lambda-go/events"

	"github.com/vramq/vramq/internal/testenv/apigw"
	"github.com/vramq/vramq/publisher"
)

// fakeBatches counts what the Lambda function asks of the batches.
type fakeBatches struct {
	swept    int
	advanced []string
	err      error
}

func (f *fakeBatches) Sweep(context.Context) error {
	f.swept++
	return f.err
}

func (f *fakeBatches) AdvanceBatch(_ context.Context, id string) error {
	f.advanced = append(f.advanced, id)
	return f.err
}

// snsEvent is the event SNS invokes a subscribed function with, one record
// per message (the Lambda Developer Guide's example, with message).
func snsEvent(messages ...string) json.RawMessage {
	var ev events.SNSEvent
	for _, m := range messages {
		ev.Records = append(ev.Records, events.SNSEventRecord{EventVersion: "1.0", EventSource: "aws:sns",
			EventSubscriptionArn: "arn:aws:sns:us-east-1:123456789012:vramq-events:2bcfbf39",
			SNS:                  events.SNSEntity{Type: "Notification", TopicArn: "arn:aws:sns:us-east-1:123456789012:vramq-events", Message: m}})
	}
	raw, _ := json.Marshal(ev)
	return raw
}

// One Lambda function takes the API's events, the EventBridge schedule's
// and the completion events': a scheduled event (EventBridge's sample,
// "Scheduled Event" from aws.events) runs a sweep and not the API; an SNS
// event advances the batches its completion events name, and no other job;
// an API event runs the API alone; a sweep that fails is a function error.
func TestLambdaEventsSchedule(t *testing.T) {
	var served int
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		served++
		w.WriteHeader(http.StatusTeapot)
	})
	b := &fakeBatches{}
	fn := publisher.LambdaEvents(h, b)
	scheduled := json.RawMessage(`{"version":"0","id":"53dc4d37-cffa-4f76-80c9-8b7d4a4d2eaa","detail-type":"Scheduled Event",` +
		`"source":"aws.events","account":"123456789012","time":"2015-10-08T16:53:06Z","region":"us-east-1",` +
		`"resources":["arn:aws:events:us-east-1:123456789012:rule/my-scheduled-rule"],"detail":{}}`)
	if _, err := fn(t.Context(), scheduled); err != nil || b.swept != 1 || served != 0 || len(b.advanced) != 0 {
		t.Fatalf("scheduled event: %v, %+v, served %d; want one sweep", err, b, served)
	}
	sns := snsEvent(`{"v":1,"event":"job.completed","job_id":"batch_0193a1b2c3d4e5f60718293a4b5c6d7e","batch_id":"batch_0193a1b2c3d4e5f60718293a4b5c6d7e","revision":1}`,
		`{"v":1,"event":"job.completed","job_id":"j-1","revision":1}`)
	if _, err := fn(t.Context(), sns); err != nil || b.swept != 1 || served != 0 || len(b.advanced) != 1 ||
		b.advanced[0] != "batch_0193a1b2c3d4e5f60718293a4b5c6d7e" {
		t.Fatalf("SNS event: %v, %+v, served %d; want the batch advanced, and nothing else", err, b, served)
	}
	raw, _ := json.Marshal(apigw.Event("GET", "/v1/batches", nil, ""))
	out, err := fn(t.Context(), raw)
	if res, ok := out.(events.APIGatewayV2HTTPResponse); err != nil || !ok || res.StatusCode != http.StatusTeapot || served != 1 || b.swept != 1 {
		t.Fatalf("API event: %#v %v, %+v, served %d; want one request served", out, err, b, served)
	}
	b.err = errors.New("store down")
	if _, err := fn(t.Context(), scheduled); err == nil {
		t.Error("a failed sweep is no function error")
	}
}
