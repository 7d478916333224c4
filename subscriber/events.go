package subscriber

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/vramq/vramq/internal/payload"
	"github.com/vramq/vramq/job"
)

// EventSink sends a job's completion event (docs/events.md): an SNS topic in
// production (package subscriber/snsevents). Publish must be safe for
// concurrent use; an error means the event may not have gone out.
type EventSink interface {
	Publish(ctx context.Context, jobID string, body []byte) error
}

// Lister lists the keys under a prefix of the payload bucket. Completion
// events need it to count a job's settled chunks; *payload.Store has it.
type Lister interface {
	List(ctx context.Context, prefix string) ([]string, error)
}

var _ Lister = (*payload.Store)(nil)

// A job's completion event goes out exactly once, whichever subscriber
// settles its last chunk and however often that chunk is redelivered:
//
//  1. After a chunk's result, failed marker or cancelled marker is stored,
//     the subscriber counts the job's settled chunks (three List calls, in
//     parallel) against its manifest; a job with chunks pending stops there.
//  2. A settled job's event is written to done/{job_id}.json with a
//     conditional write (PutIfAbsent, If-None-Match on S3): of every
//     subscriber and redelivery that finds the job settled, exactly one
//     creates the marker, and only that one publishes.
//  3. When the publish fails, the winner rewrites the marker with
//     publish_error set; a later check of the job (a redelivery of any of
//     its chunks) that finds such a marker publishes again. That edge is
//     at least once: two checks that find the same failed marker at once
//     may both send. A winner that crashes between the marker and the
//     publish leaves a marker without publish_error, and no event: that
//     edge is at most once, and the marker says the job settled.
func (s *Subscriber) jobSettling(jobID string) {
	if s.cfg.Events == nil || s.payloads == nil || !job.ValidJobID(jobID) {
		return
	}
	s.aux.Go(func() {
		ctx, cancel := context.WithTimeout(context.Background(), sendTimeout)
		defer cancel()
		// One check of a job at a time in this process: two chunks of one
		// job that settle together (a result and a failed marker, say) would
		// otherwise both find it settled and both race for the marker. The
		// conditional write decides on S3 anyway; this spares the requests,
		// and a bucket whose conditional write is a read then a write.
		mu := &s.eventLocks[fnv32(jobID)%uint32(len(s.eventLocks))]
		mu.Lock()
		defer mu.Unlock()
		if err := s.checkSettled(ctx, jobID); err != nil {
			s.m.events.WithLabelValues("error").Inc()
			s.log.Warn("checking whether a job settled failed; a redelivery of its chunks checks again",
				"job_id", jobID, "err", err)
		}
	})
}

func fnv32(s string) uint32 {
	h := fnv.New32a()
	_, _ = h.Write([]byte(s))
	return h.Sum32()
}

func (s *Subscriber) checkSettled(ctx context.Context, jobID string) error {
	raw, err := s.payloads.Read(ctx, job.ManifestKey(jobID))
	if errors.Is(err, payload.ErrMissing) {
		return nil // a message naming no job the publisher made
	}
	if err != nil {
		return err
	}
	var m job.Manifest
	if err := json.Unmarshal(raw, &m); err != nil || m.JobID != jobID || m.Chunks < 1 {
		return fmt.Errorf("manifest of %s does not parse: %v", jobID, err)
	}
	ev, settled, err := s.settledEvent(ctx, &m)
	if err != nil || !settled {
		return err
	}
	body, err := json.Marshal(ev)
	if err != nil {
		return err
	}
	created, existing, err := s.payloads.PutIfAbsent(ctx, job.DoneKey(jobID), body)
	if err != nil {
		return err
	}
	if !created {
		var old job.CompletionEvent
		if json.Unmarshal(existing, &old) != nil || old.PublishError == "" {
			return nil // sent, or being sent, by whoever wrote the marker
		}
		old.PublishError = ""
		ev = &old // the retry sends the event as first found
		if body, err = json.Marshal(ev); err != nil {
			return err
		}
	}
	if err := s.cfg.Events.Publish(ctx, jobID, body); err != nil {
		ev.PublishError = err.Error()
		if marker, merr := json.Marshal(ev); merr == nil {
			if _, perr := s.payloads.Put(ctx, job.DoneKey(jobID), marker); perr != nil {
				err = errors.Join(err, perr)
			}
		}
		return fmt.Errorf("publishing the completion event: %w", err)
	}
	if !created {
		// The retry went out: clear the error so that no later check sends again.
		if _, err := s.payloads.Put(ctx, job.DoneKey(jobID), body); err != nil {
			s.log.Warn("clearing publish_error on the done marker failed", "job_id", jobID, "err", err)
		}
	}
	s.m.events.WithLabelValues("sent").Inc()
	s.log.Info("completion event sent", "job_id", jobID, "status", ev.Status)
	return nil
}

// settledEvent counts m's settled chunks as the publisher does (a result
// wins over a failed marker, either over a cancelled one) and, when none is
// pending, returns the job's event.
func (s *Subscriber) settledEvent(ctx context.Context, m *job.Manifest) (*job.CompletionEvent, bool, error) {
	ls := s.cfg.Payloads.(Lister) // checked by Config.validate
	prefixes := []string{job.ResultPrefix(m.JobID), job.FailedPrefix(m.JobID), job.CancelledPrefix(m.JobID)}
	sets := make([]map[int]bool, len(prefixes))
	g, gctx := errgroup.WithContext(ctx)
	for i, p := range prefixes {
		g.Go(func() error {
			keys, err := ls.List(gctx, p)
			s.m.payloadRequests.WithLabelValues("list", outcomeOf(err)).Inc()
			if err != nil {
				return err
			}
			sets[i] = chunksIn(keys, p, m.Chunks)
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, false, err
	}
	done, failed, cancelled := sets[0], sets[1], sets[2]
	for c := range done {
		delete(failed, c)
		delete(cancelled, c)
	}
	for c := range failed {
		delete(cancelled, c)
	}
	if len(done)+len(failed)+len(cancelled) < m.Chunks {
		return nil, false, nil
	}
	bucket := s.payloads.Bucket()
	ev := &job.CompletionEvent{V: job.Version, Event: job.EventJobSettled, JobID: m.JobID, Status: job.EventComplete,
		Chunks: m.Chunks, ChunksDone: len(done), ChunksFailed: len(failed), ChunksCancelled: len(cancelled), Items: m.Items,
		ResultsURI: "s3://" + bucket + "/" + job.ResultPrefix(m.JobID),
		FailedURI:  "s3://" + bucket + "/" + job.FailedPrefix(m.JobID),
		At:         time.Now().UTC().Format(time.RFC3339)}
	for c := range done {
		if c < len(m.ChunkItems) {
			ev.ItemsDone += m.ChunkItems[c]
		}
	}
	switch {
	case len(cancelled) > 0:
		ev.Status = job.EventCancelled
	case len(failed) > 0:
		ev.Status = job.EventPartial
	}
	return ev, true, nil
}

// chunksIn is the set of chunk numbers below chunks that keys under prefix
// name ({prefix}{chunk}.json); anything else is ignored.
func chunksIn(keys []string, prefix string, chunks int) map[int]bool {
	set := make(map[int]bool, len(keys))
	for _, k := range keys {
		n, err := strconv.Atoi(strings.TrimSuffix(strings.TrimPrefix(k, prefix), ".json"))
		if err == nil && n >= 0 && n < chunks && k == prefix+strconv.Itoa(n)+".json" {
			set[n] = true
		}
	}
	return set
}

func outcomeOf(err error) string {
	if err != nil {
		return "error"
	}
	return "ok"
}
