package subscriber

import "sync"

// maxSuspects bounds the suspects remembered; the oldest are forgotten
// first, which at worst batches a suspect again.
const maxSuspects = 10_000

// suspects are messages that were in a batch that failed for a reason that
// may pass (a timeout, a model error), by message ID. Which message caused
// the failure is unknown, and batch-mates share a receive count and so a
// retry delay: released together, they would come back together, be batched
// together again, and all reach the redrive policy's maxReceiveCount with
// the one message that hangs. So a suspect runs in a batch of its own until
// it succeeds, and the culprit takes no other message with it.
type suspects struct {
	mu    sync.Mutex
	set   map[string]struct{}
	order []string // insertion order, for forgetting the oldest
}

func newSuspects() *suspects { return &suspects{set: map[string]struct{}{}} }

func (s *suspects) add(ids ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, id := range ids {
		if _, ok := s.set[id]; ok {
			continue
		}
		if len(s.order) >= maxSuspects {
			delete(s.set, s.order[0])
			s.order = s.order[1:]
		}
		s.set[id] = struct{}{}
		s.order = append(s.order, id)
	}
}

func (s *suspects) has(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.set[id]
	return ok
}

// clear forgets id; its place in order is dropped when it comes up.
func (s *suspects) clear(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.set, id)
	if len(s.set) == 0 {
		s.order = s.order[:0]
	}
}
