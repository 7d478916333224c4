package main

import (
	"encoding/json"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/google/go-cmp/cmp"

	"github.com/vramq/vramq/job"
)

func TestMedianOf(t *testing.T) {
	for _, tc := range []struct {
		xs   []float64
		want float64
	}{
		{[]float64{3}, 3},
		{[]float64{5, 1, 3}, 3},
		{[]float64{4, 1, 3, 2}, 2.5},
		{[]float64{10, 10, 1, 1000, 11}, 10}, // an outlier run moves the median nowhere
	} {
		in := slices.Clone(tc.xs)
		if got := medianOf(tc.xs); got != tc.want {
			t.Errorf("medianOf(%v) = %v, want %v", tc.xs, got, tc.want)
		}
		if !slices.Equal(in, tc.xs) {
			t.Errorf("medianOf reordered its argument: %v, was %v", tc.xs, in)
		}
	}
	if got := medianOf(nil); !math.IsNaN(got) {
		t.Errorf("medianOf(nil) = %v, want NaN", got)
	}
}

func TestRotationGivesEveryVariantEveryPlace(t *testing.T) {
	const n = 4
	first := map[int]bool{}
	for trial := range n {
		order := rotation(n, trial)
		if got := slices.Sorted(slices.Values(order)); !slices.Equal(got, []int{0, 1, 2, 3}) {
			t.Fatalf("trial %d: order %v is not a permutation of 0..3", trial, order)
		}
		first[order[0]] = true
	}
	if len(first) != n {
		t.Errorf("in %d trials only variants %v ran first", n, first)
	}
}

// The table's ratios are ours over each variant: of the medians, and the
// median of the ratios within each trial, which a drifting load cancels out
// of. Here the load halves every figure in trial 3: the paired ratio does
// not move, the ratio of medians does.
func TestTrialSetRatios(t *testing.T) {
	set := trialSet{Names: []string{"ours", "bare"}, Rates: [][]float64{
		{90, 90, 45},
		{100, 100, 50},
	}}
	got := set.rows()
	want := []ratioRow{
		{Name: "ours", Median: 90, Min: 45, Max: 90, Ratio: 1, PairedRatio: 1},
		{Name: "bare", Median: 100, Min: 50, Max: 100, Ratio: 0.9, PairedRatio: 0.9},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("rows (-want +got):\n%s", diff)
	}
	var b strings.Builder
	set.markdown(&b, "ours")
	if !strings.Contains(b.String(), "| bare | 100 | 50–100 | **0.90** | 0.90 |") {
		t.Errorf("markdown table lacks the bare row:\n%s", b.String())
	}
}

func TestPairedRatios(t *testing.T) {
	if got := pairedRatios([]float64{2, 9, 4}, []float64{4, 3}); !slices.Equal(got, []float64{0.5, 3}) {
		t.Errorf("pairedRatios = %v, want [0.5 3] (pairs only as far as both go)", got)
	}
}

func TestReplaceSection(t *testing.T) {
	begin, end := sectionMarkers("rss")
	for _, tc := range []struct {
		name, doc, want string
	}{
		{"empty file", "", begin + "\nnew\n" + end + "\n"},
		{"appended after prose", "# Title\nprose", "# Title\nprose\n\n" + begin + "\nnew\n" + end + "\n"},
		{"replaced, prose kept", "# T\n" + begin + "\nold\nlines\n" + end + "\nafter\n", "# T\n" + begin + "\nnew\n" + end + "\nafter\n"},
		{"other sections kept", "a\n<!-- bench overhead: x -->\n" + begin + "\nold\n" + end + "\n", "a\n<!-- bench overhead: x -->\n" + begin + "\nnew\n" + end + "\n"},
	} {
		got, err := replaceSection(tc.doc, "rss", "new\n\n")
		if err != nil || got != tc.want {
			t.Errorf("%s: got %q, %v; want %q", tc.name, got, err, tc.want)
		}
	}
	if _, err := replaceSection(end+"\n"+begin+"\n", "rss", "x"); err == nil {
		t.Error("markers in the wrong order accepted")
	}
	if _, err := replaceSection(begin+"\n", "rss", "x"); err == nil {
		t.Error("a begin marker without its end accepted")
	}
}

// -consumers keeps the report's order whatever the list's, and refuses a
// name it does not know rather than run fewer consumers than asked.
func TestConsumersSelection(t *testing.T) {
	var cc consumeConfig
	cs, err := cc.consumers("pipelined-results, subscriber")
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, c := range cs {
		keys = append(keys, c.key)
	}
	if !slices.Equal(keys, []string{"subscriber", "pipelined-results"}) {
		t.Errorf("consumers %v, want subscriber then pipelined-results", keys)
	}
	if all, _ := cc.consumers(allConsumers); len(all) != 6 {
		t.Errorf("%d consumers by default, want 6", len(all))
	}
	if _, err := cc.consumers("subscriber,pipelined-result"); err == nil || !strings.Contains(err.Error(), "pipelined-result") {
		t.Errorf("an unknown consumer: err %v, want one naming it", err)
	}
}

// The json bare loop's result is the one the subscriber would send for the
// same message with the no-op model, and a malformed body is an error.
func TestEncodeResult(t *testing.T) {
	w := tinyWorks("overhead", 3)[2]
	body, err := json.Marshal(w)
	if err != nil {
		t.Fatal(err)
	}
	got, err := encodeResult(types.Message{Body: aws.String(string(body))})
	if err != nil {
		t.Fatal(err)
	}
	var r job.Result
	if err := json.Unmarshal([]byte(got), &r); err != nil {
		t.Fatal(err)
	}
	if r.Key() != w.Key() || len(r.Outputs) != len(w.Items) || r.Outputs[0].ID != w.Items[0].ID || string(r.Outputs[0].Data) != "0" {
		t.Errorf("result %s for work %s", got, body)
	}
	if _, err := encodeResult(types.Message{Body: aws.String("{"), MessageId: aws.String("m1")}); err == nil || !strings.Contains(err.Error(), "m1") {
		t.Errorf("a malformed body: err %v, want one naming the message", err)
	}
}
