package subscriber

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"

	"golang.org/x/sync/errgroup"

	"github.com/vramq/vramq/job"
)

// maxResultWrites bounds the result writes of one batch in flight at once.
const maxResultWrites = 8

// storeResults writes each result to results/{job_id}/{chunk}.json, in
// parallel, and returns a reference to each object, nil where the write
// failed, with that write's error. The first write of a chunk wins: a
// redelivered chunk reuses the object already there, so a result message
// sent earlier with a reference to it still verifies (a rewrite with another
// attempt number would change its SHA-256 under that message).
func (s *Subscriber) storeResults(results []job.Result, bodies [][]byte) ([]*job.PayloadRef, []error) {
	ctx, cancel := context.WithTimeout(context.Background(), sendTimeout)
	defer cancel()
	refs := make([]*job.PayloadRef, len(results))
	errs := make([]error, len(results))
	var g errgroup.Group
	g.SetLimit(maxResultWrites)
	for i := range results {
		g.Go(func() error {
			ref, err := s.storeResult(ctx, &results[i], bodies[i])
			if err != nil {
				s.log.Warn("storing the result failed", "job_id", results[i].JobID, "chunk", results[i].Chunk, "err", err)
				errs[i] = err
				return nil
			}
			s.m.resultsStored.Inc()
			refs[i] = &ref
			return nil
		})
	}
	_ = g.Wait()
	seen := make(map[string]bool)
	for i, r := range results {
		if refs[i] != nil && !seen[r.JobID] {
			seen[r.JobID] = true
			s.jobSettling(r.JobID)
		}
	}
	return refs, errs
}

func (s *Subscriber) storeResult(ctx context.Context, r *job.Result, body []byte) (job.PayloadRef, error) {
	ref, failed, err := s.storeResultObject(ctx, r, body)
	if err == nil && failed > 0 {
		// After the result, and on every delivery: a crash in between
		// redelivers the message, which writes it then.
		err = s.markItemErrors(ctx, r.Key(), failed)
	}
	return ref, err
}

// storeResultObject stores r unless the chunk's result is there already,
// and returns a reference to the stored result and how many of its items
// failed. The count is the stored result's, not r's: a redelivery of the
// chunk that is not what ran first (anyone who can send to the queue can
// send one, with other items) must not change the chunk's item-error
// marker, so the marker always says what the result GET serves says.
func (s *Subscriber) storeResultObject(ctx context.Context, r *job.Result, body []byte) (job.PayloadRef, int, error) {
	key := job.ResultKey(r.JobID, r.Chunk)
	created, existing, err := s.payloads.PutIfAbsent(ctx, key, body)
	if err != nil {
		return job.PayloadRef{}, 0, err
	}
	if created {
		return refTo(s.payloads.Bucket(), key, body), itemErrors(r), nil
	}
	var old job.Result
	if json.Unmarshal(existing, &old) == nil && old.Key() == r.Key() && old.Ref == nil {
		return refTo(s.payloads.Bucket(), key, existing), itemErrors(&old), nil
	}
	// Not a result of this chunk: whatever it is, ours replaces it.
	s.log.Warn("replacing an object that is not this chunk's result", "key", key, "bytes", len(existing))
	ref, err := s.payloads.Put(ctx, key, body)
	return ref, itemErrors(r), err
}

func refTo(bucket, key string, body []byte) job.PayloadRef {
	sum := sha256.Sum256(body)
	return job.PayloadRef{Bucket: bucket, Key: key, Size: int64(len(body)), SHA256: hex.EncodeToString(sum[:])}
}
