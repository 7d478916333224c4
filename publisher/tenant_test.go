package publisher_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/vramq/vramq/internal/tenant"
	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/publisher"
	"github.com/vramq/vramq/publisher/api"
	"github.com/vramq/vramq/publisher/jobs"
)

// sentBatch is the part of a SendMessageBatch request (AWS JSON protocol)
// that carries the tenant.
type sentBatch struct {
	Entries []struct {
		MessageGroupId, MessageDeduplicationId *string
		MessageAttributes                      map[string]struct{ StringValue string }
	}
}

// captureSQS is an SQS endpoint that records SendMessageBatch requests and
// answers every entry sent.
func captureSQS(t *testing.T) (*sqs.Client, func() []sentBatch) {
	var mu sync.Mutex
	var got []sentBatch
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var b sentBatch
		if err := json.Unmarshal(body, &b); err != nil {
			t.Errorf("SendMessageBatch body %q: %v", body, err)
		}
		mu.Lock()
		got = append(got, b)
		mu.Unlock()
		type ok struct{ Id, MessageId, MD5OfMessageBody string }
		var out struct{ Successful []ok }
		for i := range b.Entries {
			out.Successful = append(out.Successful, ok{Id: string(rune('0' + i)), MessageId: "m", MD5OfMessageBody: "x"})
		}
		w.Header().Set("Content-Type", "application/x-amz-json-1.0")
		_ = json.NewEncoder(w).Encode(out)
	}))
	t.Cleanup(srv.Close)
	c := sqs.New(sqs.Options{Region: "us-east-1", BaseEndpoint: aws.String(srv.URL),
		Credentials: aws.AnonymousCredentials{}, DisableMessageChecksumValidation: true})
	return c, func() []sentBatch {
		mu.Lock()
		defer mu.Unlock()
		return append([]sentBatch(nil), got...)
	}
}

// TestSQSQueueTenantGroup: on a standard queue an entry's tenant is its
// MessageGroupId (SQS fair queues' tenant) and its vramq-tenant attribute;
// with no tenant there is neither; on a FIFO queue the group stays the job,
// for order, and the tenant rides in the attribute only.
func TestSQSQueueTenantGroup(t *testing.T) {
	client, got := captureSQS(t)
	std := jobs.NewSQSQueue(client, "https://sqs.us-east-1.amazonaws.com/1/work")
	fifo := jobs.NewSQSQueue(client, "https://sqs.us-east-1.amazonaws.com/1/work.fifo")
	jobID := strings.Repeat("a", 32)
	entries := []jobs.Entry{{Body: "b0", JobID: jobID, Chunk: 0, Tenant: "acme"}, {Body: "b1", JobID: jobID, Chunk: 1, Tenant: ""}}
	for _, q := range []*jobs.SQSQueue{std, fifo} {
		errs, err := q.SendBatch(t.Context(), entries)
		if err != nil || len(errs) != 2 || errs[0] != nil || errs[1] != nil {
			t.Fatalf("SendBatch: %v %v", errs, err)
		}
	}
	b := got()
	if len(b) != 2 || len(b[0].Entries) != 2 || len(b[1].Entries) != 2 {
		t.Fatalf("requests %+v", b)
	}
	s0, s1 := b[0].Entries[0], b[0].Entries[1]
	if aws.ToString(s0.MessageGroupId) != "acme" || s0.MessageDeduplicationId != nil || s0.MessageAttributes[job.AttrTenant].StringValue != "acme" {
		t.Errorf("standard queue, tenant acme: group %q dedup %v attrs %v", aws.ToString(s0.MessageGroupId), s0.MessageDeduplicationId,
			s0.MessageAttributes)
	}
	if _, ok := s1.MessageAttributes[job.AttrTenant]; s1.MessageGroupId != nil || ok {
		t.Errorf("standard queue, no tenant: group %q attrs %v", aws.ToString(s1.MessageGroupId), s1.MessageAttributes)
	}
	f0, f1 := b[1].Entries[0], b[1].Entries[1]
	if aws.ToString(f0.MessageGroupId) != jobID || aws.ToString(f1.MessageGroupId) != jobID ||
		f0.MessageAttributes[job.AttrTenant].StringValue != "acme" {
		t.Errorf("FIFO queue: groups %q %q, attrs %v", aws.ToString(f0.MessageGroupId), aws.ToString(f1.MessageGroupId), f0.MessageAttributes)
	}
}

// recordQueue is a Queue that keeps what it is sent.
type recordQueue struct {
	mu      sync.Mutex
	entries []jobs.Entry
}

func (q *recordQueue) SendBatch(_ context.Context, entries []jobs.Entry) ([]error, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.entries = append(q.entries, entries...)
	return make([]error, len(entries)), nil
}

func (q *recordQueue) take() []jobs.Entry {
	q.mu.Lock()
	defer q.mu.Unlock()
	e := q.entries
	q.entries = nil
	return e
}

func tenantPublisher(t *testing.T, keys ...string) (*httptest.Server, *recordQueue, *prometheus.Registry) {
	q := &recordQueue{}
	reg := prometheus.NewRegistry()
	p, err := publisher.New(publisher.Config{
		Queue: q,
		Jobs:  publisher.Jobs{MaxMessageBytes: 256 << 10},
		API: publisher.API{
			APIKeys:    keys,
			Registerer: reg,
			Logger:     testLogger(),
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(p.Handler())
	t.Cleanup(srv.Close)
	return srv, q, reg
}

func postTenant(t *testing.T, url string, header map[string][]string, items int) (int, string) {
	var b strings.Builder
	b.WriteString(`{"items":[`)
	for i := range items {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`{"id":"i` + string(rune('a'+i)) + `","text":"hello"}`)
	}
	b.WriteString(`],"options":{"chunk_items":1}}`)
	req, _ := http.NewRequest(http.MethodPost, url+"/v1/jobs", strings.NewReader(b.String()))
	req.Header.Set("Content-Type", "application/json")
	for k, vs := range header {
		for _, v := range vs {
			req.Header.Add(k, v)
		}
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var e struct{ Error struct{ Code string } }
	body, _ := io.ReadAll(resp.Body)
	_ = json.Unmarshal(body, &e)
	return resp.StatusCode, e.Error.Code
}

func tenantsOf(entries []jobs.Entry) []string {
	var out []string
	for _, e := range entries {
		out = append(out, e.Tenant)
	}
	return out
}

// TestTenantOfKey: with auth, a "name:key" entry's key authenticates and
// names the tenant; an unnamed key's tenant is tenant.OfKey; the header
// cannot override the key; per-tenant counters count jobs and items.
func TestTenantOfKey(t *testing.T) {
	srv, q, reg := tenantPublisher(t, "alice:k1", "alice:k1-next", "k2")
	bearer := func(k string) map[string][]string {
		return map[string][]string{"Authorization": {"Bearer " + k}, api.TenantHeader: {"mallory"}}
	}
	for _, tc := range []struct {
		key, tenant string
		items       int
	}{{"k1", "alice", 3}, {"k1-next", "alice", 2}, {"k2", tenant.OfKey("k2"), 1}} {
		if status, code := postTenant(t, srv.URL, bearer(tc.key), tc.items); status != http.StatusAccepted {
			t.Fatalf("key %s: %d %s", tc.key, status, code)
		}
		got := tenantsOf(q.take())
		if len(got) != tc.items {
			t.Fatalf("key %s: %d entries, want %d", tc.key, len(got), tc.items)
		}
		for _, g := range got {
			if g != tc.tenant {
				t.Errorf("key %s: tenant %q, want %q", tc.key, g, tc.tenant)
			}
		}
	}
	// The whole entry is not a key.
	if status, _ := postTenant(t, srv.URL, bearer("alice:k1"), 1); status != http.StatusUnauthorized {
		t.Errorf("the entry as a key: %d, want 401", status)
	}
	for _, c := range []struct {
		metric, tenant string
		want           float64
	}{
		{"vramq_publisher_tenant_jobs_accepted_total", "alice", 2},
		{"vramq_publisher_tenant_items_accepted_total", "alice", 5},
		{"vramq_publisher_tenant_jobs_accepted_total", tenant.OfKey("k2"), 1},
		{"vramq_publisher_tenant_items_accepted_total", tenant.OfKey("k2"), 1},
		{"vramq_publisher_tenant_jobs_accepted_total", "mallory", 0},
	} {
		if got := counterValue(t, reg, c.metric, c.tenant); got != c.want {
			t.Errorf("%s{tenant=%q} = %v, want %v", c.metric, c.tenant, got, c.want)
		}
	}
}

// counterValue is the value of metric{tenant=...}, 0 when absent.
func counterValue(t *testing.T, reg *prometheus.Registry, metric, tenantName string) float64 {
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != metric {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "tenant" && l.GetValue() == tenantName {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// TestTenantHeader: without auth the Vramq-Tenant header names the tenant;
// one that SQS would refuse as a MessageGroupId, or given twice, is a 400
// invalid_tenant and nothing is sent; none gives no tenant.
func TestTenantHeader(t *testing.T) {
	srv, q, reg := tenantPublisher(t)
	h := func(vs ...string) map[string][]string { return map[string][]string{api.TenantHeader: vs} }
	if status, code := postTenant(t, srv.URL, h("team/ml:prod"), 2); status != http.StatusAccepted {
		t.Fatalf("a valid tenant: %d %s", status, code)
	}
	if got := tenantsOf(q.take()); len(got) != 2 || got[0] != "team/ml:prod" || got[1] != "team/ml:prod" {
		t.Errorf("tenants %q", got)
	}
	for _, bad := range [][]string{{""}, {"a b"}, {strings.Repeat("x", 129)}, {"é"}, {"a", "b"}} {
		if status, code := postTenant(t, srv.URL, h(bad...), 1); status != http.StatusBadRequest || code != api.CodeInvalidTenant {
			t.Errorf("tenant %q: %d %s, want 400 %s", bad, status, code, api.CodeInvalidTenant)
		}
		if got := q.take(); len(got) != 0 {
			t.Errorf("tenant %q: %d entries sent", bad, len(got))
		}
	}
	if status, code := postTenant(t, srv.URL, nil, 1); status != http.StatusAccepted {
		t.Fatalf("no tenant: %d %s", status, code)
	}
	if got := tenantsOf(q.take()); len(got) != 1 || got[0] != "" {
		t.Errorf("no tenant: %q", got)
	}
	if got := counterValue(t, reg, "vramq_publisher_tenant_items_accepted_total", "team/ml:prod"); got != 2 {
		t.Errorf("items of team/ml:prod: %v", got)
	}
	if got := counterValue(t, reg, "vramq_publisher_tenant_jobs_accepted_total", tenant.None); got != 1 {
		t.Errorf("jobs of no tenant: %v", got)
	}
}

// TestSplitKey: old entries (no colon, or a prefix that cannot be a name)
// are keys whole.
func TestSplitKey(t *testing.T) {
	for _, tc := range []struct{ entry, name, key string }{
		{"alice:k1", "alice", "k1"},
		{"alice:ab:cd", "alice", "ab:cd"},
		{"plainkey", tenant.OfKey("plainkey"), "plainkey"},
		{":k", tenant.OfKey(":k"), ":k"},
		{"a b:k", tenant.OfKey("a b:k"), "a b:k"},
		{"alice:", "alice", ""},
	} {
		if n, k := api.SplitKey(tc.entry); n != tc.name || k != tc.key {
			t.Errorf("SplitKey(%q) = %q, %q; want %q, %q", tc.entry, n, k, tc.name, tc.key)
		}
	}
	if _, err := publisher.New(publisher.Config{
		Queue: &recordQueue{},
		Jobs:  publisher.Jobs{MaxMessageBytes: 256 << 10},
		API: publisher.API{
			APIKeys:    []string{"alice:"},
			Registerer: prometheus.NewRegistry(),
		},
	}); err == nil {
		t.Error("a named empty key was accepted")
	}
}
