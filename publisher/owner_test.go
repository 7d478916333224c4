package publisher_test

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/vramq/vramq/internal/payload"
	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/publisher"
	"github.com/vramq/vramq/publisher/jobs"
)

// Issue 25, item 3: a job belongs to the tenant whose key created it. Any
// other key is answered 404 on GET and DELETE, with the very body a job that
// does not exist gets, and its DELETE cancels nothing. Another key of the
// same tenant (a rotation) reads and cancels it as the first does.
func TestJobsAnswerOnlyTheirOwner(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true)
	s := e.serve(publisher.Config{API: publisher.API{APIKeys: []string{"acme:key-a", "acme:key-a2", "globex:key-b", "unnamed-key"}}})
	as := func(key string) map[string]string { return map[string]string{"Authorization": "Bearer " + key} }
	a := s.mustPost(jobBody(t, manyItems("o", 4, 2), 2), as("key-a"))
	e.drain(a.Chunks)

	missing := s.do("GET", "/v1/jobs/0123456789abcdef0123456789abcdef", as("key-b"), nil)
	if missing.status != 404 {
		t.Fatalf("GET of a job that does not exist: %d %s", missing.status, missing.body)
	}
	for _, key := range []string{"key-b", "unnamed-key"} {
		for _, method := range []string{"GET", "DELETE"} {
			r := s.do(method, "/v1/jobs/"+a.JobID, as(key), nil)
			if r.status != 404 || string(r.body) != string(missing.body) {
				t.Errorf("%s of tenant acme's job with %s: %d %s; want 404 %s", method, key, r.status, r.body, missing.body)
			}
		}
	}
	if _, err := e.store.Read(t.Context(), job.CancelKey(a.JobID)); !errors.Is(err, payload.ErrMissing) {
		t.Fatalf("another tenant's DELETE left a cancel record: %v", err)
	}
	if st := s.statusAs(t, a.JobID, as("key-a")); st.Status != jobs.StatusRunning || st.CancelledAt != nil || st.ChunksPending != a.Chunks {
		t.Errorf("the owner's GET after another tenant's DELETE: %+v; want it running, not cancelled", st)
	}
	if st := s.cancel(t, a.JobID, as("key-a2")); st.Status != jobs.StatusCancelled {
		t.Errorf("DELETE with the tenant's other key: %+v; want it cancelled", st)
	}
}

// A manifest with no owner (written before owners were recorded) answers
// no one while auth is on: nobody can show it is theirs. Without auth there
// is no caller to check, and it is served as before.
func TestJobWithoutOwner(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true)
	const id = "00112233445566778899aabbccddeeff"
	m := job.Manifest{V: 1, JobID: id, Chunks: 1, Items: 1, ChunkItems: []int{1}}
	raw, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.store.Put(t.Context(), job.ManifestKey(id), raw); err != nil {
		t.Fatal(err)
	}
	withKeys := e.serve(publisher.Config{API: publisher.API{APIKeys: []string{"acme:key-a"}}})
	missing := withKeys.do("GET", "/v1/jobs/0123456789abcdef0123456789abcdef", map[string]string{"Authorization": "Bearer key-a"}, nil)
	for _, method := range []string{"GET", "DELETE"} {
		r := withKeys.do(method, "/v1/jobs/"+id, map[string]string{"Authorization": "Bearer key-a"}, nil)
		if r.status != 404 || string(r.body) != string(missing.body) {
			t.Errorf("%s of a job without an owner, with auth: %d %s; want 404 %s", method, r.status, r.body, missing.body)
		}
	}
	if _, err := e.store.Read(t.Context(), job.CancelKey(id)); !errors.Is(err, payload.ErrMissing) {
		t.Errorf("DELETE of a job without an owner left a cancel record: %v", err)
	}
	open := e.serve(publisher.Config{})
	if st := open.status(t, id, ""); st.JobID != id || st.Status != jobs.StatusRunning {
		t.Errorf("GET without auth: %+v", st)
	}
}
