// Package gputest holds what the tests of GPU models share: Halve, the
// subscriber's answer to an out-of-memory error, for a model's own tests to
// run without a subscriber.
package gputest

import (
	"errors"

	"github.com/vramq/vramq/gpu"
)

// Halve runs batch with run; where run answers gpu.ErrOutOfMemory it runs
// each half, down to batches of one, as the subscriber does. It returns the
// outputs in batch order and the largest batch that ran; any other error
// stops it.
func Halve[T, R any](batch []T, run func([]T) ([]R, error)) (out []R, largest int, err error) {
	var rec func(part []T) error
	rec = func(part []T) error {
		o, err := run(part)
		if errors.Is(err, gpu.ErrOutOfMemory) && len(part) > 1 {
			h := len(part) / 2
			if err := rec(part[:h]); err != nil {
				return err
			}
			return rec(part[h:])
		}
		if err != nil {
			return err
		}
		out = append(out, o...)
		largest = max(largest, len(part))
		return nil
	}
	err = rec(batch)
	return out, largest, err
}
