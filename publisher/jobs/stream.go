package jobs

import (
	"context"
	"errors"

	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/publisher/api"
)

// A job too large to hold, a batch's input file, is submitted in two
// passes over its items: a Measure sizes each (and checks it encodes),
// which is enough to cut the chunks, and a Stream encodes them again and
// sends a window of chunks at a time. Neither holds the items: a Measure
// holds one size an item, a Stream a window of chunks.

// Measure sizes the items of one job, in order.
type Measure struct {
	p               *Service
	jobID, endpoint string
	budget, maxItem int
	ie              *itemEncoder
	sizes           []int64 // the encoded size of each item, claim-checked ones as their reference
	claims          int
}

// Measure starts sizing the items of job jobID for endpoint.
func (p *Service) Measure(jobID, endpoint string) *Measure {
	budget, maxItem := p.planner.bounds(jobID, endpoint)
	return &Measure{p: p, jobID: jobID, endpoint: endpoint, budget: budget, maxItem: maxItem, ie: newItemEncoder()}
}

// Add sizes the next item; an item that cannot be sent is an error.
func (m *Measure) Add(it RequestItem) *api.Error {
	enc, claim, e := m.p.planner.encodeItem(m.ie, m.jobID, len(m.sizes), it, m.budget, m.maxItem)
	if e != nil {
		return e
	}
	if claim != nil {
		m.claims++
	}
	m.sizes = append(m.sizes, int64(len(enc)))
	return nil
}

// Items is how many items were added.
func (m *Measure) Items() int { return len(m.sizes) }

// Chunks cuts the items added into chunks, as POST /v1/jobs would, and
// returns the items of each; the sizes are dropped.
func (m *Measure) Chunks() []int {
	var counts []int
	for _, c := range cutChunks(m.sizes, m.p.cfg.ChunkItems, m.budget, func(n int64) int64 { return n }) {
		counts = append(counts, len(c))
	}
	m.sizes = nil
	return counts
}

// Stream sends the chunks of one job as its items come.
type Stream struct {
	p                       *Service
	jobID, endpoint, tenant string
	counts                  []int // the items of each chunk (Measure.Chunks)
	budget, maxItem         int
	ie                      *itemEncoder
	sent                    func(context.Context) error

	cur       [][]byte // the items of chunk next
	window    []Chunk
	next      int
	added     int // the items added
	confirmed int // the chunks SQS confirmed
}

// Stream writes the manifest of job jobID, measured by m (its items cut
// as counts says), and returns a Stream for sending its items again, in
// the same order. sent, when not nil, is called after each window of
// chunks is on the queue; its error stops the stream.
func (m *Measure) Stream(ctx context.Context, tenantName, owner string, counts []int, sent func(context.Context) error) (*Stream, error) {
	p := m.p
	items := 0
	for _, n := range counts {
		items += n
	}
	if e := p.putManifest(ctx, m.jobID, owner, counts, items, m.claims); e != nil {
		return nil, errors.New(e.Message)
	}
	return &Stream{p: p, jobID: m.jobID, endpoint: m.endpoint, tenant: tenantName, counts: counts,
		budget: m.budget, maxItem: m.maxItem, ie: newItemEncoder(), sent: sent}, nil
}

// window is how many chunks a Stream holds for sending at once: a
// SendMessageBatch call's worth for each call the sender makes at once, up
// to four.
func (p *Service) window() int { return job.MaxBatch * min(p.cfg.SendConcurrency, 4) }

// Add encodes the next item, stores it if it is claim-checked, and sends
// the window once it is full. An item that cannot be sent is an *api.Error.
func (s *Stream) Add(ctx context.Context, it RequestItem) error {
	p := s.p
	enc, claim, e := p.planner.encodeItem(s.ie, s.jobID, s.added, it, s.budget, s.maxItem)
	if e != nil {
		return e
	}
	s.added++
	if claim != nil {
		if _, err := p.store.Put(ctx, claim.Ref.Key, claim.Body); err != nil {
			return err
		}
		p.m.claimChecked.Inc()
	}
	if s.cur = append(s.cur, enc); len(s.cur) < s.counts[s.next] {
		return nil
	}
	ch, e := p.planner.chunk(s.jobID, s.endpoint, s.next, len(s.counts), s.cur)
	if e != nil {
		return e
	}
	s.cur, s.window, s.next = s.cur[:0], append(s.window, ch), s.next+1
	if len(s.window) < p.window() {
		return nil
	}
	return s.flush(ctx)
}

// Close sends what is left of the window.
func (s *Stream) Close(ctx context.Context) error {
	if len(s.window) == 0 {
		return nil
	}
	return s.flush(ctx)
}

// Sent is how many chunks SQS has confirmed, a failed send's included.
func (s *Stream) Sent() int { return s.confirmed }

func (s *Stream) flush(ctx context.Context) error {
	n, err := s.p.sender.send(ctx, s.jobID, s.tenant, s.window)
	s.confirmed += n
	if err != nil {
		return err
	}
	s.window = s.window[:0]
	if s.sent != nil {
		return s.sent(ctx)
	}
	return nil
}
