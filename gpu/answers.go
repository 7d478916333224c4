package gpu

import (
	"context"

	"github.com/vramq/vramq/job"
)

// answerKey is the context key of WithAnswers.
type answerKey struct{}

// WithAnswers returns ctx carrying f, for a Model whose items are answered
// one by one (a model server's requests): its Run calls f with an item's
// index in the batch and its output as soon as it has the output, before
// the batch ends. An answer from a model server is paid for (tokens of a
// rate limit, a quota), and a batch that then fails, or is cut off by a
// shutdown, returns no outputs: f lets the caller keep each answer where
// a later run of the item, in this process or another, finds it. f may be
// called concurrently, and must not block for long; a Model need not call
// it at all.
func WithAnswers(ctx context.Context, f func(i int, out job.Output)) context.Context {
	return context.WithValue(ctx, answerKey{}, f)
}

// Answers is the function WithAnswers put in ctx, or nil.
func Answers(ctx context.Context) func(i int, out job.Output) {
	f, _ := ctx.Value(answerKey{}).(func(int, job.Output))
	return f
}
