package overhead

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/google/go-cmp/cmp"

	"github.com/vramq/vramq/harness/cmd/bench/sqsenv"
	"github.com/vramq/vramq/job"
)

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
	w := sqsenv.TinyWorks("overhead", 3)[2]
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
	if _, err := encodeResult(types.Message{Body: aws.String("{"),
		MessageId: aws.String("m1")}); err == nil || !strings.Contains(err.Error(), "m1") {
		t.Errorf("a malformed body: err %v, want one naming the message", err)
	}
}
