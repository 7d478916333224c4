//go:build cuda

package bert

// UseRowAttention makes m's fused attention run bert_attention, one block
// per query, whatever the head width: the tests check and time the
// query-tiled kernel against it.
func (m *CUDAEncoder) UseRowAttention() { m.rowAttention.Store(true) }
