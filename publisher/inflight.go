package publisher

import (
	"errors"
	"io"
	"net/http"

	"golang.org/x/sync/semaphore"
)

// Bodies in flight: every POST /v1/jobs holds its body, the items decoded
// from it and the messages cut from them until it is answered, 5 to 6
// times the body's size at its peak (BenchmarkConcurrentMaxBodies). So
// the bytes of bodies held at once, across requests, are bounded by a
// weighted semaphore of MaxBodyBytesInFlight: a request is charged its body's
// size before the body is read (its Content-Length), or, for a body sent
// without a length, as it arrives, and keeps the charge until it is
// answered. A request that finds the budget spent is answered 503
// overloaded with Retry-After at once, and nothing of it is enqueued: it
// never waits, since a waiting request would hold its connection and
// semaphore.Weighted queues in order, so one large body would stall the
// small ones behind it.

// errOverloaded is what readBody reports when the budget cannot take more.
var errOverloaded = errors.New("bodies in flight over the budget")

// bodyStep is the charge for a body of unknown length, taken each time its
// buffer grows: small bodies sent chunked are charged little.
const bodyStep = 64 << 10

// readBody reads r's body, which is at most limit bytes, charging sem for its
// buffer, and returns it with the function that gives the charge back. The
// error is an *http.MaxBytesError over the limit, errOverloaded when the
// budget is spent, or the connection's error.
func readBody(w http.ResponseWriter, r *http.Request, sem *semaphore.Weighted, limit int64) (body []byte, release func(), err error) {
	var charged int64
	release = func() {
		if charged > 0 {
			sem.Release(charged)
			charged = 0
		}
	}
	charge := func(n int64) bool {
		if !sem.TryAcquire(n) {
			return false
		}
		charged += n
		return true
	}
	rd := http.MaxBytesReader(w, r.Body, limit)
	if n := r.ContentLength; n > limit {
		return nil, release, &http.MaxBytesError{Limit: limit}
	} else if n >= 0 {
		// net/http's server delivers exactly Content-Length bytes; one more
		// is read only to see the end.
		if !charge(n) {
			return nil, release, errOverloaded
		}
		body = make([]byte, n)
		if _, err := io.ReadFull(rd, body); err != nil {
			return nil, release, err
		}
		return body, release, nil
	}
	// No length: grow the buffer by doubling, charging each growth before
	// it is made, the old buffer included while both are live.
	for {
		if len(body) == cap(body) {
			grown := min(max(2*int64(cap(body)), bodyStep), limit+1)
			if !charge(grown) {
				return nil, release, errOverloaded
			}
			nb := make([]byte, len(body), grown)
			copy(nb, body)
			sem.Release(int64(cap(body)))
			charged -= int64(cap(body))
			body = nb
		}
		n, err := rd.Read(body[len(body):cap(body)])
		body = body[:len(body)+n]
		if err == io.EOF {
			return body, release, nil
		}
		if err != nil {
			return nil, release, err
		}
	}
}
