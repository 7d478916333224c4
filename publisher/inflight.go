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
// weighted semaphore of MaxBodyBytesInFlight: a request is charged for its
// body as the body arrives (see readBody), and keeps the charge until it is
// answered. A request that finds the budget spent is answered 503
// overloaded with Retry-After at once, and nothing of it is enqueued: it
// never waits, since a waiting request would hold its connection and
// semaphore.Weighted queues in order, so one large body would stall the
// small ones behind it.

// errOverloaded is what readBody reports when the budget cannot take more.
var errOverloaded = errors.New("bodies in flight over the budget")

// bodyStep is the first charge, and buffer, of a body: small bodies are
// charged little, and a large one doubles from here.
const bodyStep = 64 << 10

// readBody reads r's body, which is at most limit bytes, charging sem for its
// buffer as the body arrives, and returns it with the function that gives
// the charge back. The buffer grows by doubling up to the declared length,
// or the limit without one, and each growth is charged before it is made.
// A declared length is not charged, or allocated, up front: a client that
// declares 32 MiB and sends nothing would hold that much of the budget, and
// of the memory, for free. The old buffer a growth copies from is garbage at
// once, like the rest of what a request leaves to the collector, and not
// charged: so a body at the limit needs exactly the limit, and always fits an
// idle budget. The error is an *http.MaxBytesError over the limit,
// errOverloaded when the budget is spent, or the connection's error.
func readBody(w http.ResponseWriter, r *http.Request, sem *semaphore.Weighted, limit int64) (body []byte, release func(), err error) {
	var charged int64
	release = func() {
		if charged > 0 {
			sem.Release(charged)
			charged = 0
		}
	}
	want, known := limit, r.ContentLength >= 0
	if known {
		if r.ContentLength > limit {
			return nil, release, &http.MaxBytesError{Limit: limit}
		}
		want = r.ContentLength
	}
	rd := http.MaxBytesReader(w, r.Body, limit)
	for {
		if known && int64(len(body)) == want {
			return body, release, nil
		}
		var n int
		var err error
		if int64(len(body)) == want {
			// No length, and the buffer is full at the limit: one byte
			// more is over it (MaxBytesReader says so), or the body ends.
			var one [1]byte
			if n, err = rd.Read(one[:]); n > 0 {
				return nil, release, &http.MaxBytesError{Limit: limit}
			}
		} else {
			if len(body) == cap(body) {
				grown := min(max(2*int64(cap(body)), bodyStep), want)
				if !sem.TryAcquire(grown - int64(cap(body))) {
					return nil, release, errOverloaded
				}
				charged += grown - int64(cap(body))
				nb := make([]byte, len(body), grown)
				copy(nb, body)
				body = nb
			}
			n, err = rd.Read(body[len(body):cap(body)])
			body = body[:len(body)+n]
		}
		switch {
		case err == io.EOF && known && int64(len(body)) < want:
			return nil, release, io.ErrUnexpectedEOF // short of the declared length
		case err == io.EOF:
			return body, release, nil
		case err != nil:
			return nil, release, err
		}
	}
}
