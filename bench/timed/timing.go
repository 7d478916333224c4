package timed

import (
	"context"
	"fmt"
	"math"
	"sync"
	"time"
)

// Timing is how long batches take on a simulated device, so that admission
// strategies can be compared for throughput without a GPU. A batch of cost
// c bytes (the gpu.Model's Cost, its working memory) takes
//
//	Launch + c / (Throughput / n)
//
// where n is the number of batches in their work phase at the time, changing
// as batches start and finish (processor sharing). So:
//
//   - Launch is per batch and does not use the device's throughput: kernel
//     launches, host-device copies and synchronisation, framework overhead.
//     Launches of concurrent batches overlap each other and others' work,
//     which is why small batches run one at a time leave a GPU idle.
//   - Work is proportional to the batch's size, and concurrent batches share
//     the device: running two at once does not make the device faster, it
//     only keeps it busy.
//   - Memory is limited as before: the batch's working memory is allocated
//     from the gpu.Sim after the launch phase, as a framework allocates during
//     the forward pass, so a batch that runs out of memory has paid its
//     launch time.
//
// The figures are a model, not a measurement; the CUDA backend's measured
// times replace them on a GPU.
type Timing struct {
	// Launch is the fixed time of every batch.
	Launch time.Duration
	// Throughput is the device's rate of work, in bytes of working memory
	// per second, shared by the batches running at once.
	Throughput float64
}

// DefaultTiming is the model vramq's benchmarks use: a 10 ms launch and
// 512 MiB/s. With the reference model's cost of 1,028 B per token, that is
// about 522,000 tokens/s in all: a large message of the bimodal workload
// (16.25 MiB) works for 32 ms, a small one (240.8 KiB) for 0.46 ms plus the
// launch.
func DefaultTiming() Timing {
	return Timing{Launch: 10 * time.Millisecond, Throughput: 512 << 20}
}

// Validate reports a Timing that cannot run.
func (t Timing) Validate() error {
	if t.Launch < 0 {
		return fmt.Errorf("timing: launch %v is negative", t.Launch)
	}
	if !(t.Throughput > 0) || math.IsInf(t.Throughput, 1) {
		return fmt.Errorf("timing: throughput %v bytes/s: want a positive, finite rate", t.Throughput)
	}
	return nil
}

// Alone is how long a batch of cost bytes takes with the device to itself.
func (t Timing) Alone(cost int64) time.Duration {
	return t.Launch + time.Duration(float64(cost)/t.Throughput*float64(time.Second))
}

// sharedDevice runs work on a device whose throughput is split evenly among
// the tasks in progress. It keeps one timer, for the task that will finish
// first at the current rate, and brings every task's remaining work up to
// date whenever a task starts, finishes or is cancelled.
type sharedDevice struct {
	rate float64 // bytes per second, for the whole device

	mu    sync.Mutex
	tasks map[*task]struct{}
	last  time.Time // when remaining work was last brought up to date
	timer *time.Timer
	busy  time.Duration // time with at least one task in progress, up to last
}

type task struct {
	remaining float64 // bytes of work left
	done      chan struct{}
}

func newSharedDevice(rate float64) *sharedDevice {
	return &sharedDevice{rate: rate, tasks: map[*task]struct{}{}}
}

// work blocks until bytes of work are done on the device, or ctx ends.
func (d *sharedDevice) work(ctx context.Context, bytes int64) error {
	if bytes <= 0 {
		return ctx.Err()
	}
	t := &task{remaining: float64(bytes), done: make(chan struct{})}
	d.mu.Lock()
	d.advance(time.Now())
	d.tasks[t] = struct{}{}
	d.reschedule()
	d.mu.Unlock()
	select {
	case <-t.done:
		return nil
	case <-ctx.Done():
		d.mu.Lock()
		d.advance(time.Now())
		if _, ok := d.tasks[t]; ok {
			delete(d.tasks, t)
			d.reschedule()
		}
		d.mu.Unlock()
		return ctx.Err()
	}
}

// finishSlack is how close to done, in bytes, a task counts as done: the
// timer fires on a clock of nanoseconds, so the last fraction of a byte may
// be left over.
const finishSlack = 1.0

// advance brings the device up to now and completes the tasks it finishes.
// The device does not wait for the host: when the timer fires late (a busy
// machine runs it milliseconds after it was due), each task that finished
// in the meantime is taken out at the moment it finished and the others
// have the whole throughput from then on, rather than sharing it with a task
// that no longer has work. Only the news of a finish comes late, as it does
// from a real GPU. d.mu is held.
func (d *sharedDevice) advance(now time.Time) {
	for len(d.tasks) > 0 && now.After(d.last) {
		n := float64(len(d.tasks))
		least := math.Inf(1)
		for t := range d.tasks {
			least = min(least, t.remaining)
		}
		avail := now.Sub(d.last)
		step := avail
		if need := time.Duration(math.Ceil(least * n / d.rate * float64(time.Second))); need < avail {
			step = need
		}
		each := step.Seconds() * d.rate / n
		for t := range d.tasks {
			t.remaining -= each
			if t.remaining <= finishSlack {
				close(t.done)
				delete(d.tasks, t)
			}
		}
		d.busy += step
		d.last = d.last.Add(step)
	}
	d.last = now
}

// reschedule sets the timer for the next task to finish. d.mu is held.
func (d *sharedDevice) reschedule() {
	if d.timer != nil {
		d.timer.Stop()
		d.timer = nil
	}
	if len(d.tasks) == 0 {
		return
	}
	least := math.Inf(1)
	for t := range d.tasks {
		least = min(least, t.remaining)
	}
	wait := time.Duration(math.Ceil(least * float64(len(d.tasks)) / d.rate * float64(time.Second)))
	d.timer = time.AfterFunc(wait, func() {
		d.mu.Lock()
		defer d.mu.Unlock()
		d.advance(time.Now())
		d.reschedule()
	})
}

// Busy is the time the device has spent with work in progress.
func (d *sharedDevice) Busy() time.Duration {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.advance(time.Now())
	d.reschedule()
	return d.busy
}
