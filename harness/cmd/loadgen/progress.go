package main

import (
	"fmt"
	"io"
	"os"
	"time"

	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"
)

// progress is a bar on a terminal, and nothing elsewhere (CI logs, pipes,
// files), where a bar's redraws would be noise: the summary at the end says
// what happened.
type progress struct {
	bar *progressbar.ProgressBar
	w   io.Writer
}

func newProgress(w io.Writer, total int, what string) *progress {
	p := &progress{w: w}
	if f, ok := w.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		p.bar = progressbar.NewOptions(total, progressbar.OptionSetWriter(w), progressbar.OptionSetDescription(what),
			progressbar.OptionShowCount(), progressbar.OptionSetWidth(30), progressbar.OptionThrottle(100*time.Millisecond),
			progressbar.OptionShowElapsedTimeOnFinish())
	}
	return p
}

func (p *progress) set(n int) {
	if p.bar != nil {
		_ = p.bar.Set(n)
	}
}

func (p *progress) finish() {
	if p.bar != nil {
		_ = p.bar.Finish()
		fmt.Fprintln(p.w)
	}
}

// setTotal changes the bar's end, for totals known only as they come.
func (p *progress) setTotal(n int) {
	if p.bar != nil && int64(n) != p.bar.GetMax64() {
		p.bar.ChangeMax(n)
	}
}
