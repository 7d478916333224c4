package publisher_test

import (
	"testing"

	"github.com/vramq/vramq/publisher/publishertest"
)

// TestBadRequests sends every case of the API table (publishertest, which
// the Lambda function runs too) to publishers on real queues over HTTP and
// checks the status, the JSON error, and that nothing but the seed job
// reached the queue.
func TestBadRequests(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true)
	withBucket := e.serve(publishertest.Config())
	noBucketCfg := publishertest.Config()
	noBucketCfg.APIKeys = nil
	noBucket := (&env{t: t, client: e.client, urls: e.urls, seen: e.seen}).serve(noBucketCfg) // same queue, no bucket

	seed := withBucket.mustPost([]byte(`{"items":[{"id":"seed","text":"x"}]}`),
		map[string]string{"Authorization": "Bearer " + publishertest.Key, "Idempotency-Key": "seed-key"})

	cases := publishertest.Cases(seed.JobID, "seed-key")
	if len(cases) < 20 {
		t.Fatalf("only %d cases", len(cases))
	}
	for _, tc := range cases {
		t.Run(tc.Name, func(t *testing.T) {
			s := withBucket
			if tc.NoBucket {
				s = noBucket
			}
			method, path, h := tc.Request()
			r := s.do(method, path, h, []byte(tc.Body))
			publishertest.Check(t, tc, r.status, r.header, r.body)
		})
	}
	msgs := e.drain(1)
	if len(msgs) != 1 || msgs[0].work.JobID != seed.JobID {
		for _, m := range msgs {
			t.Errorf("on the queue: job %s chunk %d", m.work.JobID, m.work.Chunk)
		}
		t.Fatalf("%d messages on the queue, want only the seed job's", len(msgs))
	}
	if n := e.queued(); n != 1 {
		t.Errorf("queue counts %d messages, want 1", n)
	}
}
