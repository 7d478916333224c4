package publisher_test

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/vramq/vramq/internal/payload"
	"github.com/vramq/vramq/internal/testenv/s3front"
	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/publisher"
	"github.com/vramq/vramq/publisher/publishertest"
)

// fileID is a file id made at created, of the grammar newFileID's are:
// its last hex digit even for an upload, odd for a batch's output.
func fileID(created time.Time, purpose string) string {
	var rnd [10]byte
	_, _ = rand.Read(rnd[:])
	id := []byte(fmt.Sprintf("file-%012x%s", created.UnixMilli(), hex.EncodeToString(rnd[:])))
	last := &id[len(id)-1]
	v := bytes.IndexByte([]byte("0123456789abcdef"), *last) &^ 1
	if purpose == "batch_output" {
		v |= 1
	}
	*last = "0123456789abcdef"[v]
	return string(id)
}

// putFileRecord stores the record of a file of owner's, made at created,
// of purpose, expiring at expires, as the publisher writes one (no content:
// a listing reads none).
func putFileRecord(t *testing.T, store *payload.Store, owner string, created time.Time, purpose string, expires time.Time) string {
	t.Helper()
	id := fileID(created, purpose)
	rec := fmt.Sprintf(`{"v":1,"id":%q,"owner":%q,"filename":"f.jsonl","bytes":10,"lines":1,"purpose":%q,"created_at":%d,"expires_at":%d}`,
		id, owner, purpose, created.Unix(), expires.Unix())
	if _, err := store.Put(t.Context(), job.FileRecordKey(owner, id), []byte(rec)); err != nil {
		t.Fatal(err)
	}
	return id
}

// countedStore is e's bucket through an S3 front that counts requests.
func countedStore(t *testing.T, e *env) (*payload.Store, *s3front.Front) {
	return publishertest.FrontedStore(t, e.store)
}

// Issue 34, item 5: a listing reads at most limit+1+100 records, whatever
// the caller holds. Of a tenant's files, newest first: 150 uploads that
// expired, 20 output files, one live upload. purpose=batch_output passes
// the uploads by on their ids and reads one round of 8 (it read 152
// records before); purpose=batch reads 102, answers an empty page with
// has_more (the bound cut it short), and deletes the expired records it
// read, so that the next listing reaches the live upload; a file made
// longer ago than the longest expiry (30 days) is passed by unread.
func TestFileListingReadsAreBounded(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true)
	store, front := countedStore(t, e)
	s := e.serve(publisher.Config{Payloads: store, API: publisher.API{APIKeys: []string{"acme:key-a"}}})
	a := s.client("key-a")
	now := time.Now()
	live := putFileRecord(t, e.store, "acme", now.Add(-3*time.Hour), "batch", now.Add(time.Hour))
	putFileRecord(t, e.store, "acme", now.Add(-31*24*time.Hour), "batch", now.Add(time.Hour)) // a record S3 still holds, past any expiry
	var outputs []string
	for i := range 20 {
		outputs = append(outputs, putFileRecord(t, e.store, "acme", now.Add(-2*time.Hour+time.Duration(i)*time.Second), "batch_output", now.Add(time.Hour)))
	}
	var expired []string
	for i := range 150 {
		expired = append(expired, putFileRecord(t, e.store, "acme", now.Add(-time.Hour+time.Duration(i)*time.Second), "batch", now.Add(-time.Minute)))
	}
	reads := func() int { return front.Count(s3front.Reads("files/")) }

	before := reads()
	page, err := a.listFiles(t.Context(), "limit=1&purpose=batch_output")
	if err != nil || len(page.Data) != 1 || page.Data[0].ID != outputs[len(outputs)-1] || !page.HasMore {
		t.Errorf("limit 1, purpose batch_output: %v %s; want the newest output file, %s, and has_more", err, page.RawJSON(), outputs[len(outputs)-1])
	}
	if n := reads() - before; n > 8 {
		t.Errorf("limit 1, purpose batch_output: %d records read; want one round, 8 at most", n)
	}

	var got []string
	for call := 1; call <= 3 && len(got) == 0; call++ {
		before = reads()
		page, err = a.listFiles(t.Context(), "limit=1&purpose=batch")
		if err != nil {
			t.Fatalf("limit 1, purpose batch: %s", apiError(err))
		}
		if n := reads() - before; n > 1+1+100 {
			t.Errorf("limit 1, purpose batch, call %d: %d records read; want at most limit+1+100 = 102", call, n)
		}
		for _, f := range page.Data {
			got = append(got, f.ID)
		}
		if len(got) == 0 && !page.HasMore {
			t.Fatalf("call %d: an empty page without has_more, with a live file unlisted: %s", call, page.RawJSON())
		}
	}
	if !slices.Equal(got, []string{live}) {
		t.Errorf("limit 1, purpose batch: listed %q; want the live upload %s within 2 calls", got, live)
	}
	left := 0
	for _, id := range expired {
		if _, err := e.store.Read(t.Context(), job.FileRecordKey("acme", id)); err == nil {
			left++
		}
	}
	if left != 0 {
		t.Errorf("%d of the 150 expired records are still in the bucket after the listings read them", left)
	}
}

// Issue 34, item 5: a tenant holds at most -max-files files. An upload
// past it is refused 403 too_many_files, in OpenAI's shape, and keeps
// nothing; a DELETE makes room, and a file made longer ago than the
// longest expiry does not count. Another tenant has room of its own.
func TestFileCountIsBounded(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true)
	s := e.serve(publisher.Config{MaxFiles: 3, API: publisher.API{APIKeys: []string{"acme:key-a", "globex:key-b"}}})
	a, b := s.client("key-a"), s.client("key-b")
	var ids []string
	for i := range 3 {
		ids = append(ids, upload(t, a, fmt.Sprintf("f%d.jsonl", i), batchLines(1, "c")).ID)
	}
	over := fileParams{name: "over.jsonl", data: batchLines(1, "o")}
	_, err := a.newFile(t.Context(), over)
	wantAPIError(t, "the 4th upload with -max-files 3", err, 403, "too_many_files", "file")
	keys, err := e.store.List(t.Context(), job.FilesPrefix("acme"))
	if err != nil || len(keys) != 2*3 {
		t.Errorf("after the refusal the tenant's prefix holds %q (%v); want its 3 files' 6 objects", keys, err)
	}
	upload(t, b, "globex.jsonl", batchLines(1, "g"))

	if err := a.deleteFile(t.Context(), ids[0]); err != nil {
		t.Fatalf("Delete: %s", apiError(err))
	}
	putFileRecord(t, e.store, "acme", time.Now().Add(-31*24*time.Hour), "batch", time.Now().Add(time.Hour))
	upload(t, a, "room.jsonl", batchLines(1, "r"))
	_, err = a.newFile(t.Context(), over)
	wantAPIError(t, "an upload at the limit again", err, 403, "too_many_files", "file")
}

// Issue 34, item 5: a batch's lines are bounded by the file limits
// (-max-file-lines, OpenAI's 50,000), not by -max-items, which bounds a job
// posted in one body: with -max-items 2, a 5-line batch runs as one job of
// 5 items, where a job of 3 items is refused.
func TestBatchLinesAreBoundedByTheFileLimits(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true)
	s := e.serve(publisher.Config{MaxFileLines: 5, Jobs: publisher.Jobs{MaxItems: 2, ChunkItems: 2}, API: publisher.API{APIKeys: []string{"acme:key-a"}}})
	a := s.client("key-a")
	f := upload(t, a, "five.jsonl", batchLines(5, "b"))
	if bt := newBatch(t, a, f.ID, "/v1/embeddings"); bt.Status != "in_progress" || bt.RequestCounts.Total != 5 {
		t.Errorf("a 5-line batch with -max-items 2: %s", bt.RawJSON())
	}
	if r := s.post(jobBody(t, manyItems("j", 3, 2), 0), map[string]string{"Authorization": "Bearer key-a"}); r.status != 422 ||
		!bytes.Contains(r.body, []byte("too_many_items")) {
		t.Errorf("a job of 3 items with -max-items 2: %d %s", r.status, r.body)
	}
	_, err := a.newFile(t.Context(), fileParams{name: "six.jsonl", data: batchLines(6, "x")})
	wantAPIError(t, "a 6-line file with -max-file-lines 5", err, 400, "too_many_lines", "file")
}
