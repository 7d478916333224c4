package jobs

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/vramq/vramq/internal/batcher"
	"github.com/vramq/vramq/internal/tenant"
	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/publisher/api"
)

// numberReserve stands in for the digits of the chunk numbers, which are not
// known until the whole job is planned: the body's "chunk" and "chunks" and
// the vramq-chunk attribute.
const numberReserve = 3 * 20

// longestTenant stands in for the job's tenant while it is planned, so that a
// job is cut the same way whoever sends it: an idempotent retry sends it
// again under its id, cut as before.
var longestTenant = strings.Repeat("t", tenant.MaxLen)

// overhead is what a message of job jobID carries besides its items, as SQS
// counts it (job.MessageSize): the envelope and the attributes, the tenant's
// at its longest, with room for the chunk numbers.
func overhead(jobID, endpoint string) int {
	return job.MessageSize(envelopePrefix(jobID, endpoint, 0, 0)+envelopeSuffix, attributes(jobID, 0, longestTenant)) + numberReserve
}

// Chunk is one planned work message.
type Chunk struct {
	Index int
	Items int
	// Body is the job.Work JSON, complete with the job's chunk count.
	Body string
}

// Claim is an item that travels through S3: the object to upload and the
// reference its message carries, computed before the upload so the plan is
// final before anything leaves the process.
type Claim struct {
	Index int // position of the item in the job
	ID    string
	Body  []byte
	Ref   job.PayloadRef
}

// Plan is a job cut into messages.
type Plan struct {
	Chunks []Chunk
	Claims []Claim
}

// Planner cuts jobs into chunks. Its limits come from the Config.
type Planner struct {
	// MaxMessageBytes is the queue's largest message, attributes included.
	MaxMessageBytes int
	// MaxItemBytes is the largest encoded item carried inline; larger ones
	// are claim-checked when Bucket is set, refused otherwise.
	MaxItemBytes int
	// Bucket is the payload bucket, "" when there is none.
	Bucket string
}

// maxInlineItem is the largest encoded item that fits a message on its own,
// whatever the job id and chunk numbers, in a job without an endpoint. A
// job with one has a longer envelope: PlanFor claim-checks what no longer
// fits.
func maxInlineItem(maxMessageBytes int) int {
	return maxMessageBytes - overhead(newJobIDPlaceholder, "")
}

var newJobIDPlaceholder = string(bytes.Repeat([]byte("0"), jobIDLen))

// Plan cuts items, in order, into chunks of at most chunkItems items whose
// messages fit MaxMessageBytes. An item whose encoding exceeds MaxItemBytes
// becomes a Claim and travels as {id, ref}; without a bucket it is a 413.
func (pl *Planner) Plan(jobID string, items []RequestItem, chunkItems int) (*Plan, *api.Error) {
	return pl.PlanFor(jobID, "", items, chunkItems)
}

// PlanFor is Plan for a job with this endpoint ("" for none), which every
// work message names. An item's body is claim-checked as a text is.
func (pl *Planner) PlanFor(jobID, endpoint string, items []RequestItem, chunkItems int) (*Plan, *api.Error) {
	if endpoint != "" && !job.ValidEndpoint(endpoint) {
		// DecodeJobRequest refuses it; the envelope could not hold it.
		return nil, api.Err(http.StatusInternalServerError, api.CodeInternal, "a job was planned for an endpoint outside the API")
	}
	budget, maxItem := pl.bounds(jobID, endpoint)
	p := &Plan{}
	encs := make([][]byte, len(items))
	ie := newItemEncoder()
	for i, it := range items {
		enc, claim, e := pl.encodeItem(ie, jobID, i, it, budget, maxItem)
		if e != nil {
			return nil, e
		}
		if claim != nil {
			p.Claims = append(p.Claims, *claim)
		}
		encs[i] = enc
	}
	chunks := cutChunks(encs, chunkItems, budget, func(enc []byte) int64 { return int64(len(enc)) })
	p.Chunks = make([]Chunk, len(chunks))
	for i, items := range chunks {
		c, e := pl.chunk(jobID, endpoint, i, len(chunks), items)
		if e != nil {
			return nil, e
		}
		p.Chunks[i] = c
	}
	return p, nil
}

// bounds are the bytes a message of job jobID has for its items, and the
// largest encoded item carried inline.
func (pl *Planner) bounds(jobID, endpoint string) (budget, maxItem int) {
	budget = pl.MaxMessageBytes - overhead(jobID, endpoint)
	// The envelope of a job with an endpoint is longer than maxInlineItem
	// allows for, by the endpoint's field.
	return budget, min(pl.MaxItemBytes, budget)
}

// encodeItem encodes item i of job jobID for its message, or, when that is
// over maxItem, its reference and the Claim to upload.
func (pl *Planner) encodeItem(ie *itemEncoder, jobID string, i int, it RequestItem, budget, maxItem int) ([]byte, *Claim, *api.Error) {
	enc := ie.encode(&job.Item{ID: it.ID, Text: it.Text, Data: it.Data, Body: it.Body})
	if len(enc) <= maxItem {
		return enc, nil, nil
	}
	if pl.Bucket == "" {
		return nil, nil, api.ItemErr(http.StatusRequestEntityTooLarge, api.CodeItemTooLarge, it.ID,
			"the item is over the %d bytes that fit in a message, and no payload bucket is configured for larger ones", maxItem)
	}
	sum := sha256.Sum256(enc)
	c := &Claim{Index: i, ID: it.ID, Body: enc, Ref: job.PayloadRef{
		Bucket: pl.Bucket, Key: job.ItemKey(jobID, it.ID), Size: int64(len(enc)), SHA256: hex.EncodeToString(sum[:]),
	}}
	ref := c.Ref
	enc = ie.encode(&job.Item{ID: it.ID, Ref: &ref})
	if len(enc) > budget {
		// Only a pathological bucket name could do this.
		return nil, nil, api.ItemErr(http.StatusRequestEntityTooLarge, api.CodeItemTooLarge, it.ID,
			"even the item's payload reference does not fit in a message")
	}
	return enc, c, nil
}

// cutChunks cuts a job's encoded items, whose sizes size gives, into its
// chunks. A chunk's items are joined by commas: each item is charged its
// comma, and the budget has room for the one more than a chunk has.
func cutChunks[T any](encs []T, chunkItems, budget int, size func(T) int64) [][]T {
	return batcher.Cut(encs, batcher.Bounds{Count: chunkItems, Size: int64(budget) + 1},
		func(enc T) (int, int64) { return 1, size(enc) + 1 })
}

// chunk is chunk i of the chunks of job jobID, made of its encoded items.
func (pl *Planner) chunk(jobID, endpoint string, i, chunks int, items [][]byte) (Chunk, *api.Error) {
	// Sized exactly, once: a growing buffer, then a copy into a string,
	// tripled what planning allocates for a large job
	// (BenchmarkConcurrentMaxBodies).
	prefix := envelopePrefix(jobID, endpoint, i, chunks)
	size := len(prefix) + len(items) - 1 + len(envelopeSuffix)
	for _, enc := range items {
		size += len(enc)
	}
	var body strings.Builder
	body.Grow(size)
	body.WriteString(prefix)
	for j, enc := range items {
		if j > 0 {
			body.WriteByte(',')
		}
		body.Write(enc)
	}
	body.WriteString(envelopeSuffix)
	attrs := attributes(jobID, i, longestTenant)
	if n := job.MessageSize(body.String(), attrs); n > pl.MaxMessageBytes {
		// The budget makes this impossible; refuse rather than send a
		// message SQS would reject halfway through a job.
		return Chunk{}, api.Err(http.StatusInternalServerError, api.CodeInternal, "chunk %d planned at %d bytes, over the message limit", i, n)
	}
	return Chunk{Index: i, Items: len(items), Body: body.String()}, nil
}

// The work message is written by hand around the encoded items so that its
// size is known exactly while planning; its field order and content are
// those of job.Work, and tests decode it with job.DecodeWork.
func envelopePrefix(jobID, endpoint string, chunk, chunks int) string {
	ep := ""
	if endpoint != "" {
		// One of job.Endpoints, none of which JSON escapes.
		ep = `,"endpoint":"` + endpoint + `"`
	}
	return `{"v":` + strconv.Itoa(job.Version) + `,"job_id":"` + jobID + `","chunk":` + strconv.Itoa(chunk) +
		`,"chunks":` + strconv.Itoa(chunks) + ep + `,"items":[`
}

const envelopeSuffix = `]}`

// itemEncoder is api.EncodeJSON for a job's items, one after another, with one
// encoder and one buffer for the whole job: a fresh encoder and buffer per
// item were most of planning's allocations.
type itemEncoder struct {
	buf bytes.Buffer
	enc *json.Encoder
}

func newItemEncoder() *itemEncoder {
	e := &itemEncoder{}
	e.enc = json.NewEncoder(&e.buf)
	e.enc.SetEscapeHTML(false)
	return e
}

// encode returns it encoded as api.EncodeJSON does, in a slice of its own.
func (e *itemEncoder) encode(it *job.Item) []byte {
	e.buf.Reset()
	if err := e.enc.Encode(it); err != nil {
		panic(fmt.Sprintf("publisher: encoding item %q: %v", it.ID, err))
	}
	b := bytes.TrimSuffix(e.buf.Bytes(), []byte("\n"))
	if !job.NeedsSQSEscape(b) {
		return bytes.Clone(b)
	}
	return job.EncodeForSQS(b) // a new slice
}

// plannedItems is the request's items in the order they are cut into
// chunks: as sent, or, with options.group_prefixes, the items that share a
// prefix key (job.PrefixKey) together, so that a subscriber sends them to
// the model server together and its prefix cache serves all but the first.
// Their outputs then come back in that order; the order is the same every
// time the job is planned, so an idempotent retry cuts it as before.
func (r *JobRequest) plannedItems() []RequestItem {
	if r.Options == nil || !r.Options.GroupPrefixes || r.Endpoint == "" {
		return r.Items
	}
	keys := make([]string, len(r.Items))
	for i, it := range r.Items {
		keys[i] = job.PrefixKey(r.Endpoint, it.Body)
	}
	out := make([]RequestItem, len(r.Items))
	for i, j := range job.PrefixOrder(keys) {
		out[i] = r.Items[j]
	}
	return out
}
