package publisher

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"

	"github.com/aws/aws-lambda-go/events"

	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/publisher/api"
)

// LambdaBatches is what the publisher's Lambda function runs for the events
// that are not the API's: *Publisher.
type LambdaBatches interface {
	Sweep(ctx context.Context) error
	AdvanceBatch(ctx context.Context, id string) error
}

// LambdaEvents is the publisher's Lambda function: the API's events
// (api.LambdaEventHandler of h: payload 2.0 or 1.0); the EventBridge schedule's, each a sweep of the
// batches (which server mode runs on a timer instead); and the completion
// events' topic's, where an event naming a batch advances it at once, so a
// settled batch is finalized without waiting for the schedule. One function
// takes all three, told apart by the event's shape: a scheduled event is
// EventBridge's envelope with source aws.events and detail-type "Scheduled
// Event" (EventBridge User Guide, "Creating a rule that runs on a
// schedule"), and SNS's is Records[] with EventSource aws:sns (Lambda
// Developer Guide, "Using Lambda with Amazon SNS"); no API Gateway event is
// either.
func LambdaEvents(h http.Handler, b LambdaBatches) func(context.Context, json.RawMessage) (any, error) {
	serve := api.LambdaEventHandler(h)
	return func(ctx context.Context, raw json.RawMessage) (any, error) {
		var ev events.EventBridgeEvent
		if json.Unmarshal(raw, &ev) == nil && ev.Source == "aws.events" && ev.DetailType == "Scheduled Event" {
			if err := b.Sweep(ctx); err != nil {
				// The function error is in the schedule's metrics; the
				// batches that failed are tried again at the next pass.
				slog.ErrorContext(ctx, "batch sweep", "err", err)
				return nil, fmt.Errorf("batch sweep: %w", err)
			}
			return nil, nil
		}
		var sns events.SNSEvent
		if json.Unmarshal(raw, &sns) == nil && len(sns.Records) > 0 && sns.Records[0].EventSource == "aws:sns" {
			return nil, completionEvents(ctx, b, sns)
		}
		return serve(ctx, raw)
	}
}

// completionEvents advances the batch each completion event names. A
// failure is a function error, which SNS's asynchronous invocation retries;
// the sweeper finds the batch anyway.
func completionEvents(ctx context.Context, b LambdaBatches, sns events.SNSEvent) error {
	var errs []error
	for _, r := range sns.Records {
		var ev job.CompletionEvent
		if err := json.Unmarshal([]byte(r.SNS.Message), &ev); err != nil || ev.BatchID == "" {
			continue // not a batch's event: nothing to advance
		}
		if err := b.AdvanceBatch(ctx, ev.BatchID); err != nil {
			slog.ErrorContext(ctx, "advancing a batch on its completion event", "batch_id", ev.BatchID, "err", err)
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
