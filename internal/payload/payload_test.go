package payload_test

import (
	"errors"
	"testing"

	"github.com/vramq/vramq/internal/payload"
	"github.com/vramq/vramq/internal/testenv/sqstest"
	"github.com/vramq/vramq/job"
)

func TestStore(t *testing.T) {
	c := sqstest.S3(t)
	s := payload.New(c, sqstest.Bucket(t, c))
	ctx := t.Context()

	ref, err := s.Put(ctx, job.ItemKey("j1", "a"), []byte(`{"id":"a","text":"hello"}`))
	if err != nil {
		t.Fatal(err)
	}
	if ref.Key != "payloads/j1/ca978112ca1bbdcafac231b39a23dc4da786eff8147c4e72b9807785afee48bb.json" || ref.Size != 25 || len(ref.SHA256) != 64 {
		t.Errorf("ref %+v", ref)
	}
	b, err := s.Get(ctx, ref)
	if err != nil || string(b) != `{"id":"a","text":"hello"}` {
		t.Fatalf("Get = %q, %v", b, err)
	}

	// A changed object, or one whose reference lies, is corrupt.
	bad := ref
	bad.SHA256 = "0000000000000000000000000000000000000000000000000000000000000000"
	if _, err := s.Get(ctx, bad); !errors.Is(err, payload.ErrCorrupt) {
		t.Errorf("wrong hash: %v", err)
	}
	bad = ref
	bad.Size++
	if _, err := s.Get(ctx, bad); !errors.Is(err, payload.ErrCorrupt) {
		t.Errorf("wrong size: %v", err)
	}
	if _, err := s.Put(ctx, ref.Key, []byte(`{"id":"a","text":"HELLO"}`)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(ctx, ref); !errors.Is(err, payload.ErrCorrupt) {
		t.Errorf("overwritten object: %v", err)
	}
	missing := ref
	missing.Key = "payloads/j1/404.json"
	if _, err := s.Get(ctx, missing); !errors.Is(err, payload.ErrMissing) {
		t.Errorf("missing object: %v", err)
	}

	created, _, err := s.PutIfAbsent(ctx, job.IdempotencyKey("k"), []byte("first"))
	if err != nil || !created {
		t.Fatalf("first PutIfAbsent: %v %v", created, err)
	}
	created, existing, err := s.PutIfAbsent(ctx, job.IdempotencyKey("k"), []byte("second"))
	if err != nil || created || string(existing) != "first" {
		t.Errorf("second PutIfAbsent: created %v, existing %q, %v", created, existing, err)
	}

	for i := range 3 {
		if _, err := s.Put(ctx, job.ResultKey("j1", i), []byte("{}")); err != nil {
			t.Fatal(err)
		}
	}
	keys, err := s.List(ctx, job.ResultPrefix("j1"))
	if err != nil || len(keys) != 3 {
		t.Errorf("List = %v, %v", keys, err)
	}
}
