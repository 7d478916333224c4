package subscriber

import (
	"context"

	"github.com/vramq/vramq/internal/payload"
	"github.com/vramq/vramq/job"
)

// Payloads is the bucket that holds what does not fit in a message: items
// the publisher claim-checked, results too large to send, and the results
// and failure markers the publisher reads back. *payload.Store implements it
// on S3; its methods must be safe for concurrent use, must not retry
// beyond their client's own retryer, and must return a queue.ErrRefused
// (a *queue.Error) where the bucket refuses what was sent for good.
type Payloads interface {
	// Bucket names the bucket, for the references written to messages.
	Bucket() string
	// Get fetches what ref names, verified against its size and SHA-256;
	// errors wrap payload.ErrMissing or payload.ErrCorrupt when the object
	// cannot be trusted, anything else may pass.
	Get(ctx context.Context, ref job.PayloadRef) ([]byte, error)
	// Put stores body at key, replacing what is there.
	Put(ctx context.Context, key string, body []byte) (job.PayloadRef, error)
	// PutIfAbsent stores body at key unless an object is there already, in
	// which case it returns that object's content.
	PutIfAbsent(ctx context.Context, key string, body []byte) (created bool, existing []byte, err error)
	// Create is PutIfAbsent with the conditional write first and a read
	// only when it is refused (payload.Store.Create), for done markers: it
	// works where a missing key reads as 403.
	Create(ctx context.Context, key string, body []byte) (created bool, existing []byte, err error)
	// Read fetches key, unverified; an error wraps payload.ErrMissing when
	// there is no object there. For records such as a job's cancel record.
	Read(ctx context.Context, key string) ([]byte, error)
}

var _ Payloads = (*payload.Store)(nil)

// typedNil reports a nil *payload.Store put in the interface: a caller that
// builds the store only when a bucket is configured and assigns it either
// way means "no bucket", not a store that panics on first use.
func typedNil(p Payloads) bool {
	st, ok := p.(*payload.Store)
	return ok && st == nil
}
