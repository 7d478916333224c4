package subscriber

import "sync"

// maxIDs bounds the message IDs an idSet remembers; the oldest are
// forgotten first, which at worst batches a suspect again, or runs a
// message whose result is out again.
const maxIDs = 10_000

// An idSet is a bounded set of message IDs, safe for concurrent use.
//
// Its uses: suspects are messages that were in a batch that failed for a
// reason that may pass (a timeout, a model error). Which message caused
// the failure is unknown, and batch-mates share a receive count and so a
// retry delay: released together, they would come back together, be
// batched together again, and all reach the redrive policy's
// maxReceiveCount with the one message that hangs. So a suspect runs in a
// batch of its own until it succeeds, and the culprit takes no other
// message with it. Ended messages (ends.ended) are those whose result or
// DLQ copy SQS accepted.
type idSet struct {
	mu    sync.Mutex
	set   map[string]struct{}
	order []string // insertion order, for forgetting the oldest
}

func newIDSet() *idSet { return &idSet{set: map[string]struct{}{}} }

func (s *idSet) add(ids ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, id := range ids {
		if _, ok := s.set[id]; ok {
			continue
		}
		if len(s.order) >= maxIDs {
			delete(s.set, s.order[0])
			s.order = s.order[1:]
		}
		s.set[id] = struct{}{}
		s.order = append(s.order, id)
	}
}

func (s *idSet) has(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.set[id]
	return ok
}

// clear forgets id; its place in order is dropped when it comes up.
func (s *idSet) clear(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.set, id)
	if len(s.set) == 0 {
		s.order = s.order[:0]
	}
}
