package main

import (
	"context"
	"maps"
	"sync"

	"github.com/aws/smithy-go/middleware"
)

// requestCounter counts the SQS API calls of a client by action: calls as
// the code makes them, not the SDK's retries of one, the way the
// subscriber's sqs_requests_total counts its own.
type requestCounter struct {
	mu sync.Mutex
	n  map[string]float64
}

// add is an SDK APIOptions hook: it puts the counter first in every
// operation's stack, which runs once per call.
func (c *requestCounter) add(stack *middleware.Stack) error {
	return stack.Initialize.Add(middleware.InitializeMiddlewareFunc("vramqLoadgenRequests",
		func(ctx context.Context, in middleware.InitializeInput, next middleware.InitializeHandler) (
			middleware.InitializeOutput, middleware.Metadata, error,
		) {
			c.mu.Lock()
			if c.n == nil {
				c.n = map[string]float64{}
			}
			c.n[middleware.GetOperationName(ctx)]++
			c.mu.Unlock()
			return next.HandleInitialize(ctx, in)
		}), middleware.Before)
}

func (c *requestCounter) counts() map[string]float64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return maps.Clone(c.n)
}
