package subscriber

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/vramq/vramq/internal/tenant"
	"github.com/vramq/vramq/internal/testenv/wait"
	"github.com/vramq/vramq/job"
)

// TestResultsCountedByTenant: results are counted by the work message's
// vramq-tenant attribute; a message without one, or with one that is not a
// valid name (anyone can send to the queue), counts as no tenant and is
// processed all the same. A MessageGroupId on the message (a fair queue's
// tenant) changes nothing here: the subscriber reads the attribute.
func TestResultsCountedByTenant(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := start(t, 64*mib, Config{Tenants: []string{"acme", "globex"}})
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
		wait.For(t, time.Minute, "6 results", func() bool { r, _ := h.results.Stats(); return r == 6 })
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

// Issue 25, item 11: the tenant labels are the configured names. Anyone who
// can send to the work queue writes vramq-tenant, so names that are not
// configured, however many and whichever come first, share "other tenants"
// and make no series of their own.
func TestTenantLabelsAreConfigured(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := start(t, 64*mib, Config{Tenants: []string{"acme"}, MaxInflight: 200})
		put := func(jobID, tenantName string) {
			w := job.Work{V: job.Version, JobID: jobID, Items: []job.Item{{ID: "i0", Text: "mb=1"}}}
			b, _ := json.Marshal(w)
			attrs := job.Attributes(w.Key())
			if tenantName != "" {
				attrs[job.AttrTenant] = tenantName
			}
			h.work.Put(string(b), attrs)
		}
		// The forged names come first: first come would give them labels.
		for i := range 150 {
			put(fmt.Sprint("f", i), fmt.Sprint("forged-", i))
		}
		put("a0", "acme")
		put("n0", "")
		wait.For(t, 5*time.Minute, "152 results", func() bool { r, _ := h.results.Stats(); return r == 152 })
		h.shutdown()
		for name, want := range map[string]float64{"acme": 1, tenant.Other: 150, tenant.None: 1} {
			if got := testutil.ToFloat64(h.sub.m.tenantDone.WithLabelValues(name)); got != want {
				t.Errorf("results of %q: %v, want %v", name, got, want)
			}
		}
		if n := testutil.CollectAndCount(h.sub.m.tenantDone); n != 3 {
			t.Errorf("%d tenant series, want 3 (acme, other tenants, no tenant)", n)
		}
	})
}

// A configured tenant name that is not valid is a configuration error.
func TestTenantsValidated(t *testing.T) {
	cfg := Config{Tenants: []string{"acme", "bad name"}}
	cfg.setDefaults()
	err := cfg.Validate()
	joined, _ := err.(interface{ Unwrap() []error })
	for _, e := range joined.Unwrap() {
		if fe := (*FieldError)(nil); errors.As(e, &fe) && fe.Field == "Tenants" && strings.Contains(e.Error(), `"bad name"`) {
			return
		}
	}
	t.Fatalf("Validate() = %v; want a FieldError on Tenants naming \"bad name\"", err)
}
