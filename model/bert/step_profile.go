package bert

import (
	"fmt"
	"strings"
	"sync"
	"time"
)

// stepKind is what a step of the CUDA encoder's forward pass does, for its
// per-step profile (VRAMQ_BERT_PROFILE).
type stepKind int

const (
	stepEmbed stepKind = iota
	stepQKVGemm
	stepSplit
	stepScores
	stepSoftmax
	stepPV
	stepAttention // fused: scores, softmax and P·V in one kernel
	stepMerge
	stepOutProjGemm
	stepAddLN
	stepInterGemm
	stepGELU
	stepOutGemm
	stepPool // pooling, and the L2 norm where the model normalizes
	nStepKinds
)

var stepNames = [nStepKinds]string{"embed", "qkv gemm", "split", "scores", "softmax", "P·V", "fused attention",
	"merge", "out-proj gemm", "add+LN", "inter gemm", "gelu", "out gemm", "pool"}

// step is one launch (a kernel or a cuBLAS call) of the forward pass.
type step struct {
	kind stepKind
	run  func() error
}

// stepProfile is the wall time of the forward pass by step kind. The
// launches are asynchronous, so a profile that is on waits for the device
// after each step: it tells where time goes, at the cost of the overlap
// of one launch's setup with the last one's work, so the batches it
// times run slower than without it. Off by default.
type stepProfile struct {
	mu   sync.Mutex
	on   bool
	took [nStepKinds]time.Duration
	runs [nStepKinds]int
}

// reset turns the profile on or off and forgets what it measured.
func (p *stepProfile) reset(on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.on, p.took, p.runs = on, [nStepKinds]time.Duration{}, [nStepKinds]int{}
}

// run runs steps in order, stopping at the first error. With the profile
// on, it waits for the device (wait) after each step and adds the time
// since the step began to the step's kind.
func (p *stepProfile) run(steps []step, wait func() error) error {
	p.mu.Lock()
	on := p.on
	p.mu.Unlock()
	for _, s := range steps {
		start := time.Now()
		if err := s.run(); err != nil {
			return err
		}
		if !on {
			continue
		}
		if err := wait(); err != nil {
			return err
		}
		took := time.Since(start)
		p.mu.Lock()
		p.took[s.kind] += took
		p.runs[s.kind]++
		p.mu.Unlock()
	}
	return nil
}

// String is the breakdown in the forward pass's order, each kind that ran
// with its total time, its share of the whole and how many launches it
// took: "total 4.1ms: embed 12µs (0.3%, 1), qkv gemm 820µs (20.0%, 6), …".
func (p *stepProfile) String() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var total time.Duration
	for _, d := range p.took {
		total += d
	}
	parts := make([]string, 0, nStepKinds)
	for k, d := range p.took {
		if p.runs[k] == 0 {
			continue
		}
		share := 0.0
		if total > 0 {
			share = 100 * float64(d) / float64(total)
		}
		parts = append(parts, fmt.Sprintf("%s %v (%.1f%%, %d)", stepNames[k], d.Round(time.Microsecond), share, p.runs[k]))
	}
	return fmt.Sprintf("total %v: %s", total.Round(time.Microsecond), strings.Join(parts, ", "))
}

// counts is how many launches of each kind ran, by name.
func (p *stepProfile) counts() map[string]int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := map[string]int{}
	for k, r := range p.runs {
		if r > 0 {
			n[stepNames[k]] = r
		}
	}
	return n
}
