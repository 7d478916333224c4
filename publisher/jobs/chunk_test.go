package jobs

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/vramq/vramq/internal/tenant"
	"github.com/vramq/vramq/internal/testenv/sqstest"
	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/publisher/api"
)

// decodeChunks decodes every planned message with the subscriber's decoder
// and checks it against the plan and the message limit.
func decodeChunks(t *testing.T, pl *Planner, jobID string, p *Plan) []*job.Work {
	t.Helper()
	var works []*job.Work
	for i, c := range p.Chunks {
		if n := job.MessageSize(c.Body, attributes(jobID, i, longestTenant)); n > pl.MaxMessageBytes {
			t.Errorf("chunk %d is %d bytes with its attributes, over %d", i, n, pl.MaxMessageBytes)
		}
		w, err := job.DecodeWork([]byte(c.Body))
		if err != nil {
			t.Fatalf("chunk %d does not decode: %v", i, err)
		}
		if w.JobID != jobID || w.Chunk != i || w.Chunks != len(p.Chunks) || c.Index != i || c.Items != len(w.Items) {
			t.Errorf("chunk %d: job %q chunk %d of %d, %d items (plan says %d)", i, w.JobID, w.Chunk, w.Chunks, len(w.Items), c.Items)
		}
		works = append(works, w)
	}
	return works
}

func items(n, textLen int) []RequestItem {
	out := make([]RequestItem, n)
	for i := range out {
		out[i] = RequestItem{ID: fmt.Sprintf("item-%04d", i), Text: strings.Repeat(string(rune('a'+i%26)), textLen)}
	}
	return out
}

func TestPlanByCount(t *testing.T) {
	pl := &Planner{MaxMessageBytes: 256 << 10, MaxItemBytes: maxInlineItem(256 << 10)}
	id := newJobID()
	in := items(100, 10)
	p, e := pl.Plan(id, in, 32)
	if e != nil {
		t.Fatal(e)
	}
	works := decodeChunks(t, pl, id, p)
	var sizes []int
	var got []RequestItem
	for _, w := range works {
		sizes = append(sizes, len(w.Items))
		for _, it := range w.Items {
			got = append(got, RequestItem{ID: it.ID, Text: it.Text})
		}
	}
	if fmt.Sprint(sizes) != "[32 32 32 4]" {
		t.Errorf("chunk sizes %v, want [32 32 32 4]", sizes)
	}
	if fmt.Sprint(got) != fmt.Sprint(in) {
		t.Error("items out of order or changed")
	}
	if len(p.Claims) != 0 {
		t.Errorf("%d claims, want none", len(p.Claims))
	}
}

func TestPlanBySize(t *testing.T) {
	const max = 4 << 10
	pl := &Planner{MaxMessageBytes: max, MaxItemBytes: maxInlineItem(max)}
	id := newJobID()
	in := items(40, 500) // about 530 bytes each encoded: several per message, not 32
	p, e := pl.Plan(id, in, 32)
	if e != nil {
		t.Fatal(e)
	}
	works := decodeChunks(t, pl, id, p)
	n := 0
	for i, w := range works {
		for _, it := range w.Items {
			if it.ID != in[n].ID {
				t.Fatalf("chunk %d: item %q where %q was next", i, it.ID, in[n].ID)
			}
			n++
		}
		// Greedy: the next item would not have fitted.
		if i < len(works)-1 {
			next := api.EncodeJSON(job.Item{ID: in[n].ID, Text: in[n].Text})
			if job.MessageSize(p.Chunks[i].Body, attributes(id, i, longestTenant))+1+len(next)+numberReserve <= max {
				t.Errorf("chunk %d closed at %d bytes with room for the next item (%d bytes)", i, len(p.Chunks[i].Body), len(next))
			}
		}
	}
	if n != len(in) || len(works) < 5 {
		t.Errorf("%d items in %d chunks", n, len(works))
	}
}

// Two items fill a message when their encodings and the comma between
// them fill it exactly; one byte more and the second opens a chunk.
func TestPlanCountsTheCommas(t *testing.T) {
	const max = 2 << 10
	pl := &Planner{MaxMessageBytes: max, MaxItemBytes: maxInlineItem(max)}
	id := newJobID()
	budget := max - overhead(id, "")
	short := RequestItem{ID: "b", Text: "y"}
	for _, tc := range []struct {
		over   int
		chunks int
	}{{0, 1}, {1, 2}} {
		shortLen := len(api.EncodeJSON(job.Item{ID: short.ID, Text: short.Text}))
		text := strings.Repeat("x", budget-1-shortLen-len(`{"id":"a","text":""}`)+tc.over)
		p, e := pl.Plan(id, []RequestItem{{ID: "a", Text: text}, short}, 32)
		if e != nil {
			t.Fatal(e)
		}
		decodeChunks(t, pl, id, p)
		if len(p.Chunks) != tc.chunks {
			t.Errorf("%d bytes over the budget with the comma: %d chunks, want %d", tc.over, len(p.Chunks), tc.chunks)
		}
	}
}

func TestPlanExactFit(t *testing.T) {
	// An item exactly at the inline limit travels inline, alone; one byte
	// more and it is claim-checked.
	const max = 2 << 10
	limit := maxInlineItem(max)
	id := newJobID()
	text := strings.Repeat("x", limit-len(`{"id":"a","text":""}`))
	if got := len(api.EncodeJSON(job.Item{ID: "a", Text: text})); got != limit {
		t.Fatalf("test item is %d bytes, want %d", got, limit)
	}
	pl := &Planner{MaxMessageBytes: max, MaxItemBytes: limit}
	p, e := pl.Plan(id, []RequestItem{{ID: "a", Text: text}, {ID: "b", Text: "y"}}, 32)
	if e != nil {
		t.Fatal(e)
	}
	decodeChunks(t, pl, id, p)
	if len(p.Chunks) != 2 || len(p.Claims) != 0 {
		t.Fatalf("%d chunks, %d claims; want 2 and 0", len(p.Chunks), len(p.Claims))
	}
	_, e = pl.Plan(id, []RequestItem{{ID: "a", Text: text + "x"}}, 32)
	if e == nil || e.Status != 413 || e.Code != api.CodeItemTooLarge || e.Item != "a" {
		t.Fatalf("one byte over without a bucket: %v, want 413 item_too_large", e)
	}
}

func TestPlanClaimCheck(t *testing.T) {
	const max = 8 << 10
	pl := &Planner{MaxMessageBytes: max, MaxItemBytes: 1000, Bucket: "bkt"}
	id := newJobID()
	in := []RequestItem{{ID: "small", Text: "hi"}, {ID: "big", Text: strings.Repeat("z", 5000)},
		{ID: "bin", Data: bytes.Repeat([]byte{0xff}, 2000)}, {ID: "tail", Text: "x"}}
	p, e := pl.Plan(id, in, 32)
	if e != nil {
		t.Fatal(e)
	}
	works := decodeChunks(t, pl, id, p)
	if len(works) != 1 || len(p.Claims) != 2 {
		t.Fatalf("%d chunks, %d claims; want 1 and 2", len(works), len(p.Claims))
	}
	for k, c := range p.Claims {
		idx := []int{1, 2}[k]
		if c.Index != idx || c.ID != in[idx].ID || c.Ref.Key != job.ItemKey(id, in[idx].ID) || c.Ref.Bucket != "bkt" {
			t.Errorf("claim %d: %+v", k, c)
		}
		sum := sha256.Sum256(c.Body)
		if c.Ref.SHA256 != hex.EncodeToString(sum[:]) || c.Ref.Size != int64(len(c.Body)) {
			t.Errorf("claim %d: ref %+v does not describe its body", k, c.Ref)
		}
		var stored job.Item
		if err := json.Unmarshal(c.Body, &stored); err != nil || stored.ID != in[idx].ID || stored.Text != in[idx].Text || !bytes.Equal(stored.Data, in[idx].Data) || stored.Ref != nil {
			t.Errorf("claim %d stores %+v (%v)", k, stored, err)
		}
		got := works[0].Items[idx]
		if got.Ref == nil || *got.Ref != c.Ref || got.Text != "" || got.Data != nil {
			t.Errorf("message item %d: %+v, want a reference only", idx, got)
		}
	}
}

func TestEncodeJSONEscapesWhatSQSRefuses(t *testing.T) {
	in := job.Item{ID: "e", Text: "a\uFFFEb\uFFFFc😀d\u00e9<&>"}
	b := api.EncodeJSON(in)
	for _, r := range string(b) {
		if r >= 0xFFFE {
			t.Fatalf("%q contains %U", b, r)
		}
	}
	if !bytes.Contains(b, []byte("é<&>")) {
		t.Errorf("%s: plain characters escaped", b)
	}
	var out job.Item
	if err := json.Unmarshal(b, &out); err != nil || out.ID != in.ID || out.Text != in.Text {
		t.Errorf("round trip: %+v, %v", out, err)
	}
}

// A message is cut to the queue's limit as SQS counts it, body and
// attributes (job.MessageSize), with the tenant's at its longest so that a
// job is cut the same way whoever sends it. The largest item that travels
// inline leaves unused only the room kept for the chunk numbers, which are
// not known until the job is cut (the old 256-byte allowance for attributes,
// which come to 214 bytes here, left 22 bytes more, and refused items that
// fit). On SQS (the emulator, when there is one) the message goes on a queue
// of that size.
func TestPlanSizesMessagesAsSQSCounts(t *testing.T) {
	for _, max := range []int{1 << 10, 256 << 10, 1 << 20} {
		id := newJobID()
		limit := maxInlineItem(max)
		text := strings.Repeat("x", limit-len(`{"id":"a","text":""}`))
		pl := &Planner{MaxMessageBytes: max, MaxItemBytes: limit}
		p, e := pl.Plan(id, []RequestItem{{ID: "a", Text: text}}, 32)
		if e != nil || len(p.Chunks) != 1 {
			t.Fatalf("max %d: %v", max, e)
		}
		attrs := job.Attributes(job.Key{JobID: id})
		attrs[job.AttrTenant] = strings.Repeat("t", tenant.MaxLen)
		size := job.MessageSize(p.Chunks[0].Body, attrs)
		// The room is for three numbers, of which this job uses one digit each.
		if unused := max - size; unused != numberReserve {
			t.Errorf("max %d: the largest inline item's message is %d bytes: %d unused; want the %d kept for the chunk numbers",
				max, size, unused, numberReserve)
		}
		if max == 1<<10 && os.Getenv("AWS_ENDPOINT_URL") != "" {
			q := NewSQSQueue(sqstest.Client(t), smallQueue(t, max))
			errs, err := q.SendBatch(t.Context(), []Entry{{Body: p.Chunks[0].Body, JobID: id, Tenant: attrs[job.AttrTenant]}})
			if err != nil || errs[0] != nil {
				t.Errorf("SQS refuses the message: %v %v", err, errs)
			}
		}
	}
}

// smallQueue is a queue of this test whose largest message is max bytes.
func smallQueue(t *testing.T, max int) string {
	client := sqstest.Client(t)
	name := fmt.Sprintf("vramq-small-%d", time.Now().UnixNano())
	out, err := client.CreateQueue(t.Context(), &sqs.CreateQueueInput{QueueName: &name,
		Attributes: map[string]string{"MaximumMessageSize": strconv.Itoa(max)}})
	if err != nil {
		t.Fatal(err)
	}
	url := aws.ToString(out.QueueUrl)
	t.Cleanup(func() { _, _ = client.DeleteQueue(context.Background(), &sqs.DeleteQueueInput{QueueUrl: &url}) })
	return url
}
