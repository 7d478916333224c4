package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
)

// startEmulator runs the emulator script on a free port, as make test does,
// and stops it at close.
func (s *soak) startEmulator(ctx context.Context) error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	ln.Close()
	script := func(verb string) error {
		cmd := exec.CommandContext(ctx, s.o.emulator, verb)
		cmd.Env = append(os.Environ(), "FAUXQS_PORT="+port)
		cmd.Stdout, cmd.Stderr = s.log, s.log
		return cmd.Run()
	}
	if err := script("up"); err != nil {
		return fmt.Errorf("starting the emulator with %s up: %w", s.o.emulator, err)
	}
	s.cleanup = append(s.cleanup, func() {
		cmd := exec.Command(s.o.emulator, "down")
		cmd.Env = append(os.Environ(), "FAUXQS_PORT="+port)
		cmd.Stdout, cmd.Stderr = s.log, s.log
		_ = cmd.Run()
	})
	s.o.endpoint = "http://127.0.0.1:" + port
	return nil
}
