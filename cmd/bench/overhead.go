package main

import (
	"context"
	"errors"
	"io"
)

func runOverhead(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return errors.New("overhead: not written yet")
}

func runRSS(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return errors.New("rss: not written yet")
}
