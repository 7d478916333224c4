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

// keptKey is the context key of WithKept.
type keptKey struct{}

// WithKept returns ctx carrying n, the bytes of answers (AnswerBytes) that
// the results of a batch's messages already hold from runs before this one:
// answers kept through a wait, or recalled on a redelivery. A Model that
// bounds the answers one Run keeps by what a result may hold counts them as
// answers of its own, so that an answer kept counts exactly as a fresh one.
func WithKept(ctx context.Context, n int64) context.Context {
	return context.WithValue(ctx, keptKey{}, n)
}

// Kept is the n WithKept put in ctx, or 0.
func Kept(ctx context.Context) int64 {
	n, _ := ctx.Value(keptKey{}).(int64)
	return n
}

// AnswerBytes is what an answer takes of what a result may hold: its
// response body; an output without one (an item error) takes nothing.
func AnswerBytes(o job.Output) int64 {
	if o.Response == nil {
		return 0
	}
	return int64(len(o.Response.Body))
}

// Itemwise is implemented by a backend whose items are independent requests
// that each hold their working memory only while in flight, and that tells
// each item's answer as it arrives (WithAnswers): a model server's backend.
// A batch of them does not hold its cost until its last item ends, as a
// batch on a device does: the subscriber gives back each item's share of
// its admission when the item's answer arrives, and admits the next work
// into what it held.
type Itemwise interface {
	// ItemCosts is each item's own cost, in Cost's units: together they
	// are Cost of all of them, and an item that makes no request costs 0.
	ItemCosts(endpoint string, items []job.Item) []int64
}
