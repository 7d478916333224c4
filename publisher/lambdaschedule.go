package publisher

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"

	"github.com/aws/aws-lambda-go/events"
)

// LambdaEvents is the publisher's Lambda function: the API's events
// (LambdaHandler of h), and the EventBridge schedule's (sweep, the batch
// sweeper's pass, which server mode runs on a timer instead). One function
// takes both, told apart by the event's shape: a scheduled event is
// EventBridge's envelope with source aws.events and detail-type "Scheduled
// Event" (EventBridge User Guide, "Creating a rule that runs on a
// schedule"), which no API Gateway event has.
func LambdaEvents(h http.Handler, sweep func(context.Context) error) func(context.Context, json.RawMessage) (any, error) {
	api := LambdaHandler(h)
	return func(ctx context.Context, raw json.RawMessage) (any, error) {
		var ev events.EventBridgeEvent
		if json.Unmarshal(raw, &ev) == nil && ev.Source == "aws.events" && ev.DetailType == "Scheduled Event" {
			if err := sweep(ctx); err != nil {
				// The function error is in the schedule's metrics; the
				// batches that failed are tried again at the next pass.
				slog.ErrorContext(ctx, "batch sweep", "err", err)
				return nil, fmt.Errorf("batch sweep: %w", err)
			}
			return nil, nil
		}
		var req events.APIGatewayV2HTTPRequest
		if err := json.Unmarshal(raw, &req); err != nil {
			return nil, fmt.Errorf("the event is neither an API Gateway HTTP API event nor a scheduled event: %w", err)
		}
		return api(ctx, req)
	}
}
