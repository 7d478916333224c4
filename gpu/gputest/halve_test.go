package gputest

import (
	"errors"
	"slices"
	"testing"

	"github.com/vramq/vramq/gpu"
)

// A device that holds three items at a time: a batch of ten runs as
// 2+3+2+3 in order, and another error stops the halving.
func TestHalve(t *testing.T) {
	batch := []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}
	var sizes []int
	out, largest, err := Halve(batch, func(p []int) ([]int, error) {
		if len(p) > 3 {
			return nil, gpu.ErrOutOfMemory
		}
		sizes = append(sizes, len(p))
		return slices.Clone(p), nil
	})
	if err != nil || !slices.Equal(out, batch) || largest != 3 || !slices.Equal(sizes, []int{2, 3, 2, 3}) {
		t.Errorf("Halve = %v, %d, %v, ran %v; want the batch in order, 3, nil, [2 3 2 3]", out, largest, err, sizes)
	}
	bad := errors.New("bad")
	if _, _, err := Halve(batch, func(p []int) ([]int, error) { return nil, bad }); err != bad {
		t.Errorf("another error: %v, want it returned", err)
	}
	if _, _, err := Halve(batch, func(p []int) ([]int, error) { return nil, gpu.ErrOutOfMemory }); !errors.Is(err, gpu.ErrOutOfMemory) {
		t.Errorf("out of memory alone: %v, want ErrOutOfMemory", err)
	}
}
