package strategies

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/vramq/vramq/internal/cli"
)

// -bert names a model directory whose cost the timed model takes; one the
// loader refuses is a usage error with the loader's reason, before any
// queue is touched.
func TestStrategiesBERTFlag(t *testing.T) {
	t.Setenv("AWS_REGION", "us-east-1")
	err := Run(t.Context(), []string{"-bert", t.TempDir(), "-out", ""}, &bytes.Buffer{}, &bytes.Buffer{})
	if !errors.Is(err, cli.ErrUsage) || !strings.Contains(err.Error(), "config.json") {
		t.Errorf("-bert of an empty directory: %v, want a usage error naming config.json", err)
	}
}

func TestShapeWorks(t *testing.T) {
	works, _, err := shapeWorks("1-in-3", 9)
	if err != nil {
		t.Fatal(err)
	}
	var large int
	for _, w := range works {
		if len(w.Items) == 32 {
			large++
		}
	}
	if len(works) != 9 || large != 3 {
		t.Errorf("1-in-3 of 9: %d messages, %d large; want 9 and 3", len(works), large)
	}
	if works, _, err := shapeWorks("heavy", 5); err != nil || len(works) != 5 {
		t.Errorf("heavy of 5: %d messages, %v", len(works), err)
	}
	if works, desc, err := shapeWorks("sentences", 5); err != nil || len(works) != 5 || !strings.Contains(desc, "lognormal") {
		t.Errorf("sentences of 5: %d messages, %q, %v", len(works), desc, err)
	}
	for _, bad := range []string{"1-in-0", "1-in-x", "2-in-5", "", "pareto"} {
		if _, _, err := shapeWorks(bad, 5); err == nil {
			t.Errorf("shape %q accepted", bad)
		}
	}
}
