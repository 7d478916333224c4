// Package report writes what the benchmarks measured: the machine they ran
// on, Markdown sections a command rewrites in place, JSON and PNG files.
package report

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"runtime"
	"strings"

	"gonum.org/v1/plot/vg/vgimg"
)

// Machine says where the figures were measured, as the strategies' and the
// sweep's reports put it.
func Machine() string {
	model := "unknown CPU"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for line := range strings.Lines(string(b)) {
			if name, ok := strings.CutPrefix(line, "model name"); ok {
				model = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(name), ":"))
				break
			}
		}
	}
	return fmt.Sprintf("%s/%s, %d CPUs (%s), %s", runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), model, runtime.Version())
}

// HostLine says what the figures were measured on, as the overhead and
// memory reports put it (the same facts as Machine, in their own order).
func HostLine() string {
	cpu := "unknown CPU"
	if f, err := os.Open("/proc/cpuinfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
				cpu = strings.TrimSpace(v)
				break
			}
		}
		f.Close()
	}
	return fmt.Sprintf("%d cores (%s), %s/%s, %s", runtime.NumCPU(), cpu, runtime.GOOS, runtime.GOARCH, runtime.Version())
}

// LoadAverage is the machine's 1, 5 and 15 minute load averages, as
// /proc/loadavg gives them, to say how busy it was; "unknown" elsewhere.
func LoadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(b)); err == nil && len(f) >= 3 {
		return strings.Join(f[:3], " ")
	}
	return "unknown"
}

// Publish prints a command's report, puts it in its section of the
// Markdown file md (when set) and writes rep as JSON to jsonOut (when set).
func Publish(stdout io.Writer, report, md, section, jsonOut string, rep any) error {
	fmt.Fprint(stdout, report)
	if md != "" {
		if err := updateSection(md, section, report); err != nil {
			return err
		}
	}
	if jsonOut == "" {
		return nil
	}
	b, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(jsonOut, append(b, '\n'), 0o644)
}

// WritePNG writes img to path as a PNG.
func WritePNG(path string, img *vgimg.Canvas) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
