package subscriber

import (
	"context"
	"encoding/json"

	"github.com/vramq/vramq/job"
)

// markItemErrors writes the item-error marker of chunk k, for the counts of
// GET and of the completion event.
func (s *Subscriber) markItemErrors(ctx context.Context, k job.Key, failed int) error {
	body, err := json.Marshal(job.ItemErrorsMarker{V: job.Version, JobID: k.JobID, Chunk: k.Chunk, ItemsFailed: failed})
	if err != nil {
		return err
	}
	_, err = s.payloads.Put(ctx, job.ItemErrorsKey(k.JobID, k.Chunk), body)
	return err
}

// itemErrors is how many of r's outputs carry an error.
func itemErrors(r *job.Result) int {
	n := 0
	for _, o := range r.Outputs {
		if o.Error != nil {
			n++
		}
	}
	return n
}
