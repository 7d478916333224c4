package gpu

import "github.com/vramq/vramq/job"

// LengthClasser is implemented by a Model whose batches run best when
// their items are of similar length, as a transformer's do: its work and
// memory grow with the padded length, quadratically in attention. The
// subscriber batches together only messages of one class, so that a short
// message neither waits for a long one's computation nor is cut into its
// own sub-batch beside it. Models without it have one class.
type LengthClasser interface {
	// LengthClass is the class of a message of items: a small integer,
	// equal for messages that batch well together. It is called once per
	// message, with Cost, and must be safe for concurrent use.
	LengthClass(items []job.Item) int
}
