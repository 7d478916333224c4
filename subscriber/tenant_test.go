package subscriber

import (
	"encoding/json"
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/vramq/vramq/internal/tenant"
	"github.com/vramq/vramq/job"
)

// TestResultsCountedByTenant: results are counted by the work message's
// vramq-tenant attribute; a message without one, or with one that is not a
// valid name (anyone can send to the queue), counts as no tenant and is
// processed all the same. A MessageGroupId on the message (a fair queue's
// tenant) changes nothing here: the subscriber reads the attribute.
func TestResultsCountedByTenant(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := start(t, 64*mib, Config{})
		put := func(jobID, tenantName string) {
			w := job.Work{V: job.Version, JobID: jobID, Items: []job.Item{{ID: "i0", Text: "mb=1"}}}
			b, _ := json.Marshal(w)
			attrs := job.Attributes(w.Key())
			if tenantName != "" {
				attrs[job.AttrTenant] = tenantName
			}
			h.work.Put(string(b), attrs)
		}
		for i := range 3 {
			put(fmt.Sprint("a", i), "acme")
		}
		put("b0", "globex")
		put("n0", "")
		put("x0", "bad name\n")
		waitFor(t, time.Minute, "6 results", func() bool { r, _ := h.results.Stats(); return r == 6 })
		h.shutdown()
		for name, want := range map[string]float64{"acme": 3, "globex": 1, tenant.None: 2} {
			if got := testutil.ToFloat64(h.sub.m.tenantDone.WithLabelValues(name)); got != want {
				t.Errorf("results of %q: %v, want %v", name, got, want)
			}
		}
		if n := testutil.CollectAndCount(h.sub.m.tenantDone); n != 3 {
			t.Errorf("%d tenant series, want 3", n)
		}
	})
}
