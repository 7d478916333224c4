package main

import (
	"context"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// The subscriber's series loadgen reads (subscriber/metrics.go).
const (
	metricReceived = "vramq_subscriber_messages_received_total"
	metricRequests = "vramq_subscriber_sqs_requests_total"
	metricOOMs     = "vramq_subscriber_oom_retries_total"
)

// The peak and budget series in the unit of the memory that bounds the
// subscriber's backend: a GPU's bytes, or a model server's KV tokens
// (memorySeriesOf in subscriber/metrics.go). A subscriber exports one pair.
const (
	metricPeakBytes      = "vramq_subscriber_inflight_bytes_peak"
	metricBudgetBytes    = "vramq_subscriber_budget_bytes"
	metricPeakKVTokens   = "vramq_subscriber_inflight_kv_tokens_peak"
	metricBudgetKVTokens = "vramq_subscriber_budget_kv_tokens"
)

// sample is one series of a scrape.
type sample struct {
	name   string
	labels map[string]string
	value  float64
}

// scrape is a Prometheus text page as series, counters and gauges only.
type scrape []sample

// sum adds up the series of name over all labels, and says whether any was
// there.
func (s scrape) sum(name string) (float64, bool) {
	var v float64
	found := false
	for _, x := range s {
		if x.name == name {
			v += x.value
			found = true
		}
	}
	return v, found
}

// byLabel adds up the series of name by the value of one label.
func (s scrape) byLabel(name, label string) map[string]float64 {
	out := map[string]float64{}
	for _, x := range s {
		if x.name == name {
			out[x.labels[label]] += x.value
		}
	}
	return out
}

func parseMetrics(r io.Reader) (scrape, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(r)
	if err != nil {
		return nil, err
	}
	var out scrape
	for _, name := range slices.Sorted(maps.Keys(mfs)) {
		for _, m := range mfs[name].GetMetric() {
			x := sample{name: name, labels: map[string]string{}, value: m.GetCounter().GetValue() + m.GetGauge().GetValue()}
			for _, l := range m.GetLabel() {
				x.labels[l.GetName()] = l.GetValue()
			}
			out = append(out, x)
		}
	}
	return out, nil
}

// fetchMetrics reads a Prometheus text endpoint.
func fetchMetrics(ctx context.Context, url string) (scrape, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: %s", url, resp.Status)
	}
	return parseMetrics(resp.Body)
}

// addSubscriber fills s with the subscriber's figures for this run: its
// counters' growth from before to after (before is nil when the subscriber
// could not be read at the start: its counters are then taken from zero),
// and its gauges as they are after. A counter that went down means the
// subscriber restarted in between, and the figures that need it are left
// out.
func (s *Summary) addSubscriber(before, after scrape) []string {
	var warnings []string
	delta := func(name string) *float64 {
		a, ok := after.sum(name)
		if !ok {
			return nil
		}
		b, _ := before.sum(name)
		if a < b {
			warnings = append(warnings, fmt.Sprintf("%s went from %v to %v: the subscriber restarted during the run", name, b, a))
			return nil
		}
		d := a - b
		return &d
	}
	gauge := func(name string) *float64 {
		if v, ok := after.sum(name); ok {
			return &v
		}
		return nil
	}
	s.OOMs = delta(metricOOMs)
	s.PeakBytes, s.BudgetBytes = gauge(metricPeakBytes), gauge(metricBudgetBytes)
	s.PeakKVTokens, s.BudgetKVTokens = gauge(metricPeakKVTokens), gauge(metricBudgetKVTokens)
	if r := delta(metricReceived); r != nil {
		s.SubscriberReceived = r
		// Every message is received at least once; what is above that is
		// a message received again: released by backpressure or shutdown,
		// expired, or a lost receive. The subscriber has no counter of its
		// own for it.
		if d := *r - float64(s.Messages); d >= 0 {
			s.Redeliveries = &d
		} else {
			warnings = append(warnings, fmt.Sprintf(
				"the subscriber received %v messages of %d: another consumer took some, so its redeliveries are unknown", *r, s.Messages))
		}
	}
	if _, ok := after.sum(metricRequests); ok {
		b, a := before.byLabel(metricRequests, "action"), after.byLabel(metricRequests, "action")
		req := map[string]float64{}
		for action, n := range a {
			if n < b[action] {
				warnings = append(warnings, fmt.Sprintf("%s{action=%q} went down: the subscriber restarted during the run", metricRequests, action))
				return warnings
			}
			req[action] = n - b[action]
		}
		s.SubscriberRequests = req
		s.SubscriberPerMessage = perMessage(req, s.Messages)
	}
	return warnings
}

// perMessage divides request counts by messages, with their total under
// "total"; nil without messages.
func perMessage(requests map[string]float64, messages int) map[string]float64 {
	if messages == 0 {
		return nil
	}
	out := map[string]float64{}
	var total float64
	for action, n := range requests {
		out[action] = n / float64(messages)
		total += n
	}
	out["total"] = total / float64(messages)
	return out
}
