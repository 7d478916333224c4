package workload

import (
	"cmp"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"

	"github.com/vramq/vramq/job"
)

// Load is a workload of one or more jobs, as the load generator sends it:
// each job's items drawn from Sizes and cut into work messages. The same Load
// always gives the same messages.
type Load struct {
	// JobID names the jobs: the only job is JobID, several are JobID-0,
	// JobID-1, ...
	JobID string
	// Jobs is the number of jobs; 0 means 1.
	Jobs int
	// Items is the items per job. When 0, a job is Messages messages.
	Items    int
	Messages int
	// ChunkItems is the items per message under Fixed, Uniform and Heavy
	// (Bimodal messages have their own counts); 0 means 8, a small message
	// of Mixed.
	ChunkItems int
	Sizes      Sizes
	// Seed picks the texts. Under Bimodal every job has the same texts, as
	// Mixed does; under the other kinds each job draws its own.
	Seed uint64
}

func (l Load) jobs() int       { return max(l.Jobs, 1) }
func (l Load) chunkItems() int { return cmp.Or(l.ChunkItems, 8) }

// Validate reports what is wrong with l.
func (l Load) Validate() error {
	var errs []error
	if l.Jobs < 0 || l.Items < 0 || l.Messages < 0 || l.ChunkItems < 0 {
		errs = append(errs, fmt.Errorf("jobs %d, items %d, messages %d, chunk items %d: none may be negative",
			l.Jobs, l.Items, l.Messages, l.ChunkItems))
	}
	if l.Items == 0 && l.Messages == 0 {
		errs = append(errs, errors.New("a job needs items or messages"))
	}
	if err := l.Sizes.Validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// ID is the job id of job j.
func (l Load) ID(j int) string {
	if l.jobs() == 1 {
		return l.JobID
	}
	return fmt.Sprintf("%s-%d", l.JobID, j)
}

// Works returns every job's messages, job after job.
func (l Load) Works() []job.Work {
	var all []job.Work
	for j := range l.jobs() {
		all = append(all, l.Job(j)...)
	}
	return all
}

// Job returns the messages of job j, chunks 0 to n-1 of n.
func (l Load) Job(j int) []job.Work {
	if l.Sizes.Kind == Bimodal {
		return l.bimodal(j)
	}
	per := l.chunkItems()
	total := l.Items
	if total == 0 {
		total = l.Messages * per
	}
	n := (total + per - 1) / per
	r := rand.New(rand.NewPCG(l.Seed, uint64(j)))
	works := make([]job.Work, n)
	var b strings.Builder
	for i := range works {
		items := min(per, total-i*per)
		w := job.Work{V: job.Version, JobID: l.ID(j), Chunk: i, Chunks: n, Items: make([]job.Item, items)}
		for k := range w.Items {
			w.Items[k] = job.Item{ID: fmt.Sprintf("%d-%d", i, k), Text: text(&b, l.Sizes.words(r), r.Uint64)}
		}
		works[i] = w
	}
	return works
}

// bimodal is job j as Mixed's messages; with Items set, as many of them as
// it takes, the last one cut to make the count exact.
func (l Load) bimodal(j int) []job.Work {
	s := l.Sizes
	spec := Spec{JobID: l.ID(j), Messages: l.Messages, LargeEvery: s.LargeEvery,
		SmallItems: s.SmallItems, SmallWords: s.SmallWords, LargeItems: s.LargeItems, LargeWords: s.LargeWords, Seed: l.Seed}
	if l.Items == 0 {
		return spec.Works()
	}
	spec.Messages = 0
	for n := 0; n < l.Items; spec.Messages++ {
		if spec.Large(spec.Messages) {
			n += s.LargeItems
		} else {
			n += s.SmallItems
		}
	}
	works := spec.Works()
	extra := -l.Items
	for _, w := range works {
		extra += len(w.Items)
	}
	last := &works[len(works)-1]
	last.Items = last.Items[:len(last.Items)-extra]
	return works
}
