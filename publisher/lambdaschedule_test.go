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

// One Lambda function takes the API's events and the EventBridge schedule's:
// a scheduled event (EventBridge's sample, "Scheduled Event" from
// aws.events) runs the sweep and not the API; an API event runs the API and
// not the sweep; a sweep that fails is a function error.
func TestLambdaEventsSchedule(t *testing.T) {
	var served, swept int
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		served++
		w.WriteHeader(http.StatusTeapot)
	})
	var sweepErr error
	fn := publisher.LambdaEvents(h, func(context.Context) error {
		swept++
		return sweepErr
	})
	scheduled := json.RawMessage(`{"version":"0","id":"53dc4d37-cffa-4f76-80c9-8b7d4a4d2eaa","detail-type":"Scheduled Event",` +
		`"source":"aws.events","account":"123456789012","time":"2015-10-08T16:53:06Z","region":"us-east-1",` +
		`"resources":["arn:aws:events:us-east-1:123456789012:rule/my-scheduled-rule"],"detail":{}}`)
	if _, err := fn(t.Context(), scheduled); err != nil || swept != 1 || served != 0 {
		t.Fatalf("scheduled event: %v, swept %d, served %d; want one sweep", err, swept, served)
	}
	raw, _ := json.Marshal(apigw.Event("GET", "/v1/batches", nil, ""))
	out, err := fn(t.Context(), raw)
	if res, ok := out.(events.APIGatewayV2HTTPResponse); err != nil || !ok || res.StatusCode != http.StatusTeapot || served != 1 || swept != 1 {
		t.Fatalf("API event: %#v %v, swept %d, served %d; want one request served", out, err, swept, served)
	}
	sweepErr = errors.New("store down")
	if _, err := fn(t.Context(), scheduled); err == nil {
		t.Error("a failed sweep is no function error")
	}
}
