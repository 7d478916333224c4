// Package backoff is the one rule for the growing waits between tries of
// something that failed: a first wait, doubled per try up to a ceiling, with
// a share of it taken at random so that clients that failed together do not
// all come back together.
//
// The jitter kinds are those of the AWS Architecture Blog's "Exponential
// Backoff And Jitter" (Marc Brooker, 2015): with "equal jitter" a wait is
// anywhere from half the grown wait to all of it, with "full jitter" from
// nothing to all of it. A Policy's Jitter is that random share as a number,
// so a site may take less (a fifth, say) where it wants waits to stay near
// their nominal length.
//
// A wait a server asks for (Retry-After and the like) is not a backoff: the
// site that reads it keeps its own ceiling on it.
package backoff

import (
	"context"
	"math/rand/v2"
	"time"
)

// Jitter shares, for Policy.Jitter.
const (
	// None waits the grown wait exactly: for a client alone, or where a
	// test or a log line needs the exact figure.
	None = 0.0
	// Equal is "equal jitter": half of each wait fixed, half random.
	Equal = 0.5
	// Full is "full jitter": each wait anywhere from zero to the grown wait.
	Full = 1.0
)

// Policy is a backoff: the wait before the first retry, doubled for each
// retry after it up to Max, less a random share of up to Jitter of it. The
// zero Policy waits nothing. A Policy is a value; Delay may be called
// concurrently.
type Policy struct {
	First  time.Duration // the wait before the first retry
	Max    time.Duration // the most the doubled wait grows to; First too is cut to it
	Jitter float64       // the share of each wait taken at random, from None (0) to Full (1)
}

// Base is the wait before retry number attempt (1 for the first; below 1
// counts as 1) without jitter: First doubled attempt-1 times, at most Max,
// never negative. It does not overflow, however large attempt is.
func (p Policy) Base(attempt int) time.Duration {
	d := p.First
	for i := 1; i < attempt && d > 0 && d < p.Max; i++ {
		if d > p.Max/2 {
			d = p.Max
		} else {
			d *= 2
		}
	}
	return max(min(d, p.Max), 0)
}

// Delay is Base(attempt) less a random share of it, of up to Jitter (cut
// to 0..1): from Base·(1−Jitter), exclusive, to Base, inclusive.
func (p Policy) Delay(attempt int) time.Duration {
	d, j := p.Base(attempt), p.Jitter
	if !(j > 0) || d == 0 { // NaN too: no jitter
		return d
	}
	return d - time.Duration(rand.Float64()*min(j, 1)*float64(d))
}

// Sleep waits d, or less if ctx ends first, and then says ctx's error: nil
// when the whole wait passed. A d of zero or less does not wait.
func Sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
