//go:build cuda

package bert

// UseRowAttention makes m's fused attention run bert_attention, one block
// per query, whatever the head width, with the buffers it needs: the tests
// check and time the query-tiled kernel against it. Call it before m runs
// anything.
func (m *CUDAEncoder) UseRowAttention() { m.cfg.rowAttention = true }

// ProfileSteps turns m's per-step profile on or off, as
// VRAMQ_BERT_PROFILE=1 turns it on for every encoder, and clears it.
func (m *CUDAEncoder) ProfileSteps(on bool) { m.profile.reset(on) }

// StepProfile is the time m's batches spent in each kind of step since
// ProfileSteps, and how many launches of each kind ran.
func (m *CUDAEncoder) StepProfile() (breakdown string, launches map[string]int) {
	return m.profile.String(), m.profile.counts()
}
