// Package backend names what admission weighs, besides device memory, of
// the backend a subscriber runs work on: the resources it offers, with how
// much of each, and what a batch of items needs of each. A model server
// offers them (its request slots, its rate limits' tokens); the in-process
// model on its GPU offers none, its bound being the device's memory
// (package gpu).
package backend

import "github.com/vramq/vramq/job"

// Resource is one thing a backend offers that admission hands out.
type Resource int

const (
	// Slots are the requests the backend runs at once, and those ready to
	// take a slot as it frees: a model server's concurrency, in rounds.
	// A message takes one for each request its items make.
	Slots Resource = iota
	// RateTokens are the tokens the rate limits a backend is under pass
	// within the time a batch may wait for them. A message takes what its
	// requests reserve of the limits: prompt plus the most they may
	// generate.
	RateTokens
	// NumResources is how many resources there are: the length of a
	// Vector.
	NumResources
)

var resourceNames = [NumResources]string{"slots", "rate_tokens"}

func (r Resource) String() string { return resourceNames[r] }

// Vector is an amount of each Resource.
type Vector [NumResources]int64

// Offerer is implemented by a backend that offers resources. The
// subscriber admits a message only when what it needs of every resource
// fits, as well as its device memory, takes them together and gives them
// back together once the message has ended. A message that needs more of
// a resource than is offered at the time takes all of it, and runs with
// nothing else holding any.
type Offerer interface {
	// Offers is how much of each resource admission may have handed out
	// at once now, and the most that may ever be; 0 for a resource it
	// does not offer. The subscriber reads it again as often as the
	// device's memory, and never hands out more than most.
	Offers() (now, most Vector)
	// Needs is what items of a job that names endpoint ("" for none)
	// take of each resource. Safe for concurrent use.
	Needs(endpoint string, items []job.Item) Vector
}
