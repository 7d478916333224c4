package strategies

import (
	"flag"
	"fmt"
	"strings"
	"time"

	"github.com/vramq/vramq/bench/timed"
	"github.com/vramq/vramq/internal/bytesize"
	"github.com/vramq/vramq/internal/cli"
)

// Params is one run of `bench strategies`: the workload, the device
// and its timing, shared by every strategy.
type Params struct {
	Messages   int           `json:"messages"`
	LargeEvery int           `json:"large_every"`
	Budget     int64         `json:"budget_bytes"`
	Launch     time.Duration `json:"launch_ns"`
	Throughput float64       `json:"throughput_bytes_per_second"`
	MaxBatch   int           `json:"max_batch"`
	// MaxBatchBytes is vram's batch cap; 0 is the subscriber's default.
	MaxBatchBytes int64    `json:"max_batch_bytes,omitempty"`
	Shuffled      bool     `json:"shuffled"`
	SmallCost     int64    `json:"small_message_bytes"`
	LargeCost     int64    `json:"large_message_bytes"`
	Runs          []string `json:"strategies"`
	// Shape is the workload: "1-in-N" (Mixed, every Nth message large) or
	// "heavy" (workload.HeavyTailed) or "sentences" (workload.Sentences).
	Shape string `json:"shape"`
	// ShapeDesc says what Shape is, for the report.
	ShapeDesc string `json:"shape_description"`
	// Model is what the timed model costs like: the reference model, or
	// a BERT model directory's (-bert).
	Model string `json:"model,omitempty"`
	// BERTDir is -bert: the model directory whose cost the timed model
	// takes; empty for the reference model.
	BERTDir string `json:"-"`
	// EstimateError is -estimate-error: how wrong the estimates admission
	// works with are ("none": exact).
	EstimateError string `json:"estimate_error"`
	// Subscribers run at once on the queue, each with its own device of
	// Budget.
	Subscribers int `json:"subscribers"`
}

// FlagValues are the flags that Params does not hold as is.
type FlagValues struct {
	budget, throughput, maxBatchBytes *bytesize.Size
	Shuffle                           *bool
	only, estimate, bert              *string
}

// Flags defines the flags that shape a run of the strategies, shared
// by `bench strategies` and `bench sweep`.
func Flags(fs *flag.FlagSet) (*Params, FlagValues) {
	p := &Params{}
	budget := bytesize.Size(40 << 20)
	throughput := bytesize.Size(timed.DefaultTiming().Throughput)
	maxBatchBytes := bytesize.Size(0)
	v := FlagValues{budget: &budget, throughput: &throughput, maxBatchBytes: &maxBatchBytes}
	fs.IntVar(&p.Messages, "messages", 1000, "work messages in the workload")
	fs.IntVar(&p.LargeEvery, "large-every", 5, "every Nth message is a large one (the bimodal mix; -shape 1-in-N says the same)")
	fs.StringVar(&p.Shape, "shape", "", "workload: 1-in-N (the bimodal mix, every Nth message large), heavy (heavy-tailed "+
		"sizes) or sentences (lognormal sentence lengths, drawn per item); empty: 1-in-(-large-every)")
	fs.Var(&budget, "budget", "device memory for work (the vram budget; the device holds this plus the weights), per subscriber")
	fs.DurationVar(&p.Launch, "launch", timed.DefaultTiming().Launch, "timing model: fixed time per batch")
	fs.Var(&throughput, "throughput", "timing model: device throughput, bytes of working memory per second")
	fs.IntVar(&p.MaxBatch, "max-batch", 8, "most messages per batch, every strategy")
	fs.Var(&maxBatchBytes, "max-batch-bytes", "vram: the subscriber's -max-batch-bytes (0: its default)")
	v.Shuffle = fs.Bool("shuffle", true, "send the workload in a seeded random order rather than a large message every -large-every-th")
	v.only = fs.String("only", "none,count-1,count-avg,vram-plain,vram", "strategies to run, in order")
	v.estimate = fs.String("estimate-error", "", "make the estimates admission works with wrong, not what the device allocates: "+
		"uniform:F (each message's estimate times a factor from [1-F, 1+F], the same for the same message) or bias:F (every "+
		"estimate times 1+F, e.g. bias:+0.3, bias:-0.3)")
	fs.IntVar(&p.Subscribers, "subscribers", 1, "subscribers on the one queue, each with its own simulated device of -budget")
	v.bert = fs.String("bert", "", "cost like the BERT model in `DIR` (bin/genweights -bert DIR makes one), length² attention "+
		"included, rather than the reference model; set -budget to fit its large messages")
	return p, v
}

// Apply checks the flags and completes p with them.
func (v FlagValues) Apply(p *Params) error {
	p.Budget, p.Throughput, p.MaxBatchBytes = int64(*v.budget), float64(*v.throughput), int64(*v.maxBatchBytes)
	p.Runs = strings.Split(*v.only, ",")
	p.Shuffled = *v.Shuffle
	p.BERTDir = *v.bert
	if p.Shape == "" {
		p.Shape = fmt.Sprintf("1-in-%d", p.LargeEvery)
	}
	e, err := ParseEstimateError(*v.estimate)
	if err != nil {
		return fmt.Errorf("%w: %v", cli.ErrUsage, err)
	}
	p.EstimateError = e.String()
	if p.Messages < 1 || p.Subscribers < 1 || p.Subscribers > 16 {
		return fmt.Errorf("%w: -messages must be at least 1 and -subscribers 1 to 16", cli.ErrUsage)
	}
	if err := (timed.Timing{Launch: p.Launch, Throughput: p.Throughput}).Validate(); err != nil {
		return fmt.Errorf("%w: %v", cli.ErrUsage, err)
	}
	return nil
}
