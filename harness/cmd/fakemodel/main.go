// Command fakemodel serves the project's fake model server
// (internal/testenv/fakeoai: OpenAI's routes and Anthropic's /v1/messages,
// a vLLM-style scheduler behind them) until it is stopped, so that make demo
// can run a model-server subscriber without a GPU. It prints its URL on
// stdout, then serves. Every flag has an environment variable of the same
// meaning; -h lists them.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/vramq/vramq/internal/cli"
	"github.com/vramq/vramq/internal/envflag"
	"github.com/vramq/vramq/internal/testenv/fakeoai"
)

func main() {
	cli.Main("fakemodel", func(ctx context.Context) error { return run(ctx, os.Args[1:], os.Getenv, os.Stdout) })
}

// run serves until ctx ends; the URL goes to stdout first.
func run(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	fs := flag.NewFlagSet("fakemodel", flag.ContinueOnError)
	models := fs.String("models", "fake-model", "comma-separated model names the server serves")
	if err := envflag.Parse(fs, args, getenv); err != nil {
		return err
	}
	s := fakeoai.New(fakeoai.Config{Models: envflag.List(*models)})
	defer s.Close()
	if _, err := fmt.Fprintln(stdout, s.URL()); err != nil {
		return err
	}
	<-ctx.Done()
	return nil
}
