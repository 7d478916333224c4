package main

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// page writes a subscriber /metrics page with the series loadgen reads.
func page(received, receives, deletes, sends, ooms float64) string {
	return strings.NewReplacer("RECV", ftoa(received), "RCALLS", ftoa(receives), "DCALLS", ftoa(deletes),
		"SCALLS", ftoa(sends), "OOMS", ftoa(ooms)).Replace(`# HELP vramq_subscriber_messages_received_total Messages received from the work queue.
# TYPE vramq_subscriber_messages_received_total counter
vramq_subscriber_messages_received_total RECV
# TYPE vramq_subscriber_sqs_requests_total counter
vramq_subscriber_sqs_requests_total{action="ReceiveMessage",outcome="ok"} RCALLS
vramq_subscriber_sqs_requests_total{action="ReceiveMessage",outcome="error"} 1
vramq_subscriber_sqs_requests_total{action="DeleteMessageBatch",outcome="ok"} DCALLS
vramq_subscriber_sqs_requests_total{action="SendMessageBatch",outcome="ok"} SCALLS
# TYPE vramq_subscriber_oom_retries_total counter
vramq_subscriber_oom_retries_total OOMS
# TYPE vramq_subscriber_inflight_bytes_peak gauge
vramq_subscriber_inflight_bytes_peak 3e+07
# TYPE vramq_subscriber_budget_bytes gauge
vramq_subscriber_budget_bytes 4e+07
`)
}

func ftoa(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }

func parse(t *testing.T, text string) scrape {
	t.Helper()
	s, err := parseMetrics(strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func ptr(v float64) *float64 { return &v }

// The subscriber's counters count since it started: a run's figures are
// their growth over the run, divided by the run's messages.
func TestAddSubscriberTakesTheRunsGrowth(t *testing.T) {
	before := parse(t, page(50, 10, 5, 5, 2))
	// 100 messages this run: 104 receives (4 redelivered), 15 receive calls
	// (+1 failed one, counted in both pages), 10 deletes, 10 sends, 3 OOMs.
	after := parse(t, page(154, 25, 15, 15, 5))
	s := Summary{Messages: 100}
	if w := s.addSubscriber(before, after); len(w) > 0 {
		t.Errorf("warnings: %q", w)
	}
	want := Summary{Messages: 100, OOMs: ptr(3), PeakBytes: ptr(3e7), BudgetBytes: ptr(4e7),
		SubscriberReceived: ptr(104), Redeliveries: ptr(4),
		SubscriberRequests:   map[string]float64{"ReceiveMessage": 15, "DeleteMessageBatch": 10, "SendMessageBatch": 10},
		SubscriberPerMessage: map[string]float64{"ReceiveMessage": 0.15, "DeleteMessageBatch": 0.1, "SendMessageBatch": 0.1, "total": 0.35}}
	if diff := cmp.Diff(want, s); diff != "" {
		t.Errorf("summary (-want +got):\n%s", diff)
	}
}

func TestAddSubscriberWithoutABaseline(t *testing.T) {
	s := Summary{Messages: 10}
	s.addSubscriber(nil, parse(t, page(10, 2, 1, 1, 0)))
	if s.Redeliveries == nil || *s.Redeliveries != 0 || s.SubscriberPerMessage["total"] != 0.5 {
		t.Errorf("redeliveries %v, per message %v; want 0 and a total of (3+1+1)/10", s.Redeliveries, s.SubscriberPerMessage)
	}
}

func TestAddSubscriberRefusesWhatItCannotKnow(t *testing.T) {
	t.Run("restart", func(t *testing.T) {
		s := Summary{Messages: 10}
		w := s.addSubscriber(parse(t, page(500, 90, 50, 50, 7)), parse(t, page(10, 2, 1, 1, 0)))
		if s.Redeliveries != nil || s.OOMs != nil || s.SubscriberRequests != nil || len(w) == 0 {
			t.Errorf("after a counter reset: redeliveries %v, OOMs %v, requests %v, warnings %q; want none and a warning",
				s.Redeliveries, s.OOMs, s.SubscriberRequests, w)
		}
	})
	t.Run("another consumer", func(t *testing.T) {
		s := Summary{Messages: 10}
		w := s.addSubscriber(nil, parse(t, page(6, 2, 1, 1, 0)))
		if s.Redeliveries != nil || len(w) != 1 {
			t.Errorf("6 received of 10: redeliveries %v, warnings %q; want unknown and a warning", s.Redeliveries, w)
		}
	})
}

func TestPerMessage(t *testing.T) {
	if got := perMessage(map[string]float64{"SendMessageBatch": 3}, 0); got != nil {
		t.Errorf("no messages: %v, want nil", got)
	}
	got := perMessage(map[string]float64{"SendMessageBatch": 3, "ReceiveMessage": 1}, 4)
	want := map[string]float64{"SendMessageBatch": 0.75, "ReceiveMessage": 0.25, "total": 1}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("perMessage (-want +got):\n%s", diff)
	}
}

// A subscriber in front of a model server counts its KV cache in tokens
// under series of their own (inflight_kv_tokens_peak, budget_kv_tokens) and
// exports no *_bytes ones: the summary shows its budget use in tokens.
func TestAddSubscriberShowsAKVTokenBudget(t *testing.T) {
	const kvPage = `# TYPE vramq_subscriber_messages_received_total counter
vramq_subscriber_messages_received_total 10
# TYPE vramq_subscriber_inflight_kv_tokens_peak gauge
vramq_subscriber_inflight_kv_tokens_peak 3000
# TYPE vramq_subscriber_budget_kv_tokens gauge
vramq_subscriber_budget_kv_tokens 4000
`
	s := Summary{Messages: 10}
	s.addSubscriber(nil, parse(t, kvPage))
	var out strings.Builder
	printSummary(&out, s)
	if want := "peak budget use   3000 of 4000 KV tokens (75%)\n"; !strings.Contains(out.String(), want) {
		t.Errorf("summary:\n%s\nwant the line %q", out.String(), want)
	}
	b, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"peak_admitted_kv_tokens": 3000.0, "budget_kv_tokens": 4000.0}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("JSON %s = %v; want %v", k, got[k], v)
		}
	}
	for _, k := range []string{"peak_admitted_bytes", "budget_bytes"} {
		if _, ok := got[k]; ok {
			t.Errorf("JSON has %s = %v for a subscriber that counts no bytes", k, got[k])
		}
	}
}
