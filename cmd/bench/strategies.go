package main

import (
	"context"
	"errors"
	"io"
)

func runStrategies(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return errors.New("strategies: not written yet")
}
