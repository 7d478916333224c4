package modelserver

import (
	"github.com/vramq/vramq/gpu"
	"github.com/vramq/vramq/job"
)

var _ gpu.Itemwise = (*Model)(nil)

// ItemCosts is each item's KV charge in tokens, as Cost charges them (0
// for an item Run refuses without a request): a request holds the cache
// only while it is in flight, so the subscriber gives back an item's
// charge when its answer arrives.
func (m *Model) ItemCosts(endpoint string, items []job.Item) []int64 {
	cs := make([]int64, len(items))
	for i, it := range items {
		if r, refused := m.parse(endpoint, it); refused == nil {
			cs[i] = m.kvTokens(r)
		}
	}
	return cs
}
