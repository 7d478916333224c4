package api

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/vramq/vramq/internal/payload"
	"github.com/vramq/vramq/job"
)

// Idempotency: a POST with an Idempotency-Key header is recorded, before
// anything is sent, under the SHA-256 of the key (scoped by the caller's API
// key when auth is on, so two tenants cannot collide or probe each other).
// A retry with the same key and the same body gets the same job id; one with
// another body is refused. The record holds the request's SHA-256, the job
// id, and a state:
//
//	sending   the first request is at work (or died): a retry within
//	          IdempotencyStale gets 409, after it takes the job over
//	accepted  every chunk is on the queue: a retry gets the same 202 again
//	failed    the first request answered 503: a retry sends the same job
//	          (same id, same chunks) again
//
// Sending a job again can put a chunk on the queue twice; results carry
// (job_id, chunk), so consumers collapse the repeats as they must for
// at-least-once delivery anyway.

const (
	StateSending  = "sending"
	StateAccepted = "accepted"
	StateFailed   = "failed"
)

// MaxIdempotencyKey bounds the header; the IETF draft suggests a UUID.
const MaxIdempotencyKey = 255

type IdemRecord struct {
	V             int             `json:"v"`
	JobID         string          `json:"job_id"`
	RequestSHA256 string          `json:"request_sha256"`
	State         string          `json:"state"`
	CreatedAt     time.Time       `json:"created_at"`
	UpdatedAt     time.Time       `json:"updated_at"`
	Response      json.RawMessage `json:"response,omitempty"`
	// Kind is what the request created: "" a job (POST /v1/jobs), or
	// KindBatch, KindFile or KindMessageBatch; then Answer is the body of its first 200,
	// replayed as it was.
	Kind   string          `json:"kind,omitempty"`
	Answer json.RawMessage `json:"answer,omitempty"`
}

// Kinds of IdemRecord besides a job's.
const (
	KindBatch        = "batch"
	KindFile         = "file"
	KindMessageBatch = "message_batch"
)

// IdemStore keeps idempotency records. claim stores rec unless a record is
// already there, which it returns instead; put overwrites.
type IdemStore interface {
	Claim(ctx context.Context, key string, rec IdemRecord) (existing *IdemRecord, err error)
	Put(ctx context.Context, key string, rec IdemRecord) error
}

// IdemKey is the name a header value is kept under: hex SHA-256 of the
// caller's scope and the key, so neither is stored in the clear.
func IdemKey(scope, header string) string {
	sum := sha256.Sum256([]byte(scope + "\x00" + header))
	return hex.EncodeToString(sum[:])
}

// ValidIdempotencyKey accepts 1 to 255 visible ASCII characters.
func ValidIdempotencyKey(k string) bool {
	if k == "" || len(k) > MaxIdempotencyKey {
		return false
	}
	for i := 0; i < len(k); i++ {
		if k[i] < 0x21 || k[i] > 0x7e {
			return false
		}
	}
	return true
}

// S3Idem keeps records in the payload bucket, shared by every publisher
// process and Lambda instance. The claim is S3's conditional put
// (If-None-Match), so of two concurrent first requests only one proceeds.
// Records do not expire by themselves: give the idempotency/ prefix a
// lifecycle rule.
type S3Idem struct{ Store *payload.Store }

func (s S3Idem) Claim(ctx context.Context, key string, rec IdemRecord) (*IdemRecord, error) {
	created, existing, err := s.Store.PutIfAbsent(ctx, job.IdempotencyKey(key), EncodeJSON(rec))
	if err != nil || created {
		return nil, err
	}
	var old IdemRecord
	if err := json.Unmarshal(existing, &old); err != nil {
		return nil, fmt.Errorf("idempotency record %s: %w", job.IdempotencyKey(key), err)
	}
	return &old, nil
}

func (s S3Idem) Put(ctx context.Context, key string, rec IdemRecord) error {
	_, err := s.Store.Put(ctx, job.IdempotencyKey(key), EncodeJSON(rec))
	return err
}

// memIdem keeps records in this process only, for a publisher without a
// bucket: a retry that reaches another instance, or comes after a restart or
// after ttl, is a new job. Bounded: at max records the oldest goes.
type memIdem struct {
	mu    sync.Mutex
	ttl   time.Duration
	max   int
	now   func() time.Time
	recs  map[string]memEntry
	order []memOrder // insertion order, for eviction; may name replaced entries
	seq   uint64
}

type memEntry struct {
	rec     IdemRecord
	expires time.Time
	seq     uint64
}

type memOrder struct {
	key string
	seq uint64
}

func NewMemIdem(ttl time.Duration, max int) *memIdem {
	return &memIdem{ttl: ttl, max: max, now: time.Now, recs: map[string]memEntry{}}
}

func (m *memIdem) Claim(_ context.Context, key string, rec IdemRecord) (*IdemRecord, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.now()
	if e, ok := m.recs[key]; ok && now.Before(e.expires) {
		old := e.rec
		return &old, nil
	}
	m.store(key, rec, now)
	return nil, nil
}

func (m *memIdem) Put(_ context.Context, key string, rec IdemRecord) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.store(key, rec, m.now())
	return nil
}

func (m *memIdem) store(key string, rec IdemRecord, now time.Time) {
	m.evict(now)
	m.seq++
	m.recs[key] = memEntry{rec: rec, expires: now.Add(m.ttl), seq: m.seq}
	m.order = append(m.order, memOrder{key, m.seq})
}

// evict drops expired records, and the oldest while there is no room, in
// insertion order.
func (m *memIdem) evict(now time.Time) {
	for len(m.order) > 0 {
		o := m.order[0]
		if e, ok := m.recs[o.key]; ok && e.seq == o.seq {
			if len(m.recs) < m.max && now.Before(e.expires) {
				return
			}
			delete(m.recs, o.key)
		}
		m.order = m.order[1:]
	}
}

// idempotencyHeader reads r's Idempotency-Key: whether it has one, and the
// answer when it is malformed (given twice, or not 1 to 255 visible ASCII
// characters).
func idempotencyHeader(r *http.Request) (key string, has bool, e *Error) {
	h, has := r.Header["Idempotency-Key"]
	if has && (len(h) != 1 || !ValidIdempotencyKey(h[0])) {
		return "", true, Err(http.StatusBadRequest, CodeInvalidIdempotency,
			"Idempotency-Key must be given once, as 1 to %d visible ASCII characters", MaxIdempotencyKey)
	}
	if !has {
		return "", false, nil
	}
	return h[0], true, nil
}

// CreateOnce is an Idempotency-Key on a create of the batch routes, POST
// /v1/batches, POST /v1/files and POST /v1/messages/batches, kept in the records POST /v1/jobs keeps,
// under the same name (the caller's scope and the key): a key is one
// request's, whichever route it was first used on. The first request claims
// the key (sending); its 200 is recorded (accepted) and answered again,
// byte for byte, to a retry with the same request, which creates nothing;
// any other answer (a refusal, a 503) records failed, and a retry then
// creates as if it were the first. A retry while the first is at work is
// 409, until stale has passed: the longest the first can take, after which
// it has died. A nil *CreateOnce (no key) records nothing. Not safe for
// concurrent use: one request's.
type CreateOnce struct {
	g     *Gate
	key   string // the record's name
	rec   IdemRecord
	stale time.Duration
	done  bool // the answer is recorded
}

// Outcomes of CreateOnce.claim other than an error.
const (
	ClaimNew    = iota // no request had the key, or its create failed: create
	ClaimReplay        // the first request was answered 200: replay it
)

// claim records the key, a request of kind whose digest is sum (or, for
// an upload whose digest is known only once it is read, ""), as sending.
// It returns ClaimNew, or ClaimReplay with the record, or the answer to
// give: the key used for another request, or a request still at work.
func (c *CreateOnce) Claim(r *http.Request, w http.ResponseWriter, kind, sum string) (int, *Error) {
	c.done = true // until the record is this request's
	now := c.g.now().UTC()
	c.rec = IdemRecord{V: 1, Kind: kind, RequestSHA256: sum, State: StateSending, CreatedAt: now, UpdatedAt: now}
	old, err := c.g.idem.Claim(r.Context(), c.key, c.rec)
	if err != nil {
		c.g.log.Error("idempotency record", "err", err)
		return 0, Err(http.StatusServiceUnavailable, CodeStoreUnavailable,
			"the idempotency record could not be written; nothing was created, try again")
	}
	if old == nil {
		c.done = false
		return ClaimNew, nil
	}
	switch {
	case old.Kind != kind || sum != "" && old.RequestSHA256 != "" && old.RequestSHA256 != sum:
		return 0, reusedKey()
	case old.State == StateAccepted:
		c.rec = *old
		return ClaimReplay, nil
	case old.State == StateSending && now.Sub(old.UpdatedAt) < c.stale:
		w.Header().Set("Retry-After", "1")
		return 0, Err(http.StatusConflict, CodeIdempotencyBusy, "a request with this Idempotency-Key is still being handled; retry shortly")
	}
	// The first request failed, or died: nothing of it stands, and this one
	// creates in its place.
	if err := c.g.idem.Put(r.Context(), c.key, c.rec); err != nil {
		c.g.log.Error("idempotency record", "err", err)
		return 0, Err(http.StatusServiceUnavailable, CodeStoreUnavailable,
			"the idempotency record could not be written; nothing was created, try again")
	}
	c.done = false
	return ClaimNew, nil
}

// start claims the key for a create of kind whose digest is sum, and says
// whether the create goes on: false when the request has had its answer
// (the first one's 200 replayed, or a refusal written with fail). When it
// goes on, the caller defers c.fail.
func (c *CreateOnce) Start(r *http.Request, w http.ResponseWriter, kind, sum string, fail func(*Error)) bool {
	switch n, e := c.Claim(r, w, kind, sum); {
	case e != nil:
		fail(e)
		return false
	case n == ClaimReplay:
		if e := c.Replay(w, sum); e != nil {
			fail(e)
		}
		return false
	}
	return true
}

func reusedKey() *Error {
	return Err(http.StatusUnprocessableEntity, CodeIdempotencyReused, "this Idempotency-Key was used for another request")
}

// replay answers the first request's 200 again, if the request is the same
// (sum; an upload's is known only once it is read), else that the key was
// used for another.
func (c *CreateOnce) Replay(w http.ResponseWriter, sum string) *Error {
	if c.rec.RequestSHA256 != sum {
		return reusedKey()
	}
	c.g.Replayed(w)
	WriteJSONHeader(w, http.StatusOK)
	w.Write(c.rec.Answer)
	w.Write([]byte("\n")) // as WriteJSON ends it
	return nil
}

// answer writes v as the 200 of the create, and records it, with the
// request's digest sum, for a retry to get again.
func (c *CreateOnce) Answer(ctx context.Context, w http.ResponseWriter, sum string, v any) {
	raw := EncodeJSON(v)
	if c != nil {
		c.rec.State, c.rec.UpdatedAt, c.rec.RequestSHA256, c.rec.Answer = StateAccepted, c.g.now().UTC(), sum, raw
		c.record(ctx)
	}
	WriteJSONHeader(w, http.StatusOK)
	w.Write(raw)
	w.Write([]byte("\n"))
}

// fail records that the create failed, unless its answer was recorded:
// deferred by the handler, so that every way out but a 200 leaves the key
// to a retry.
func (c *CreateOnce) Fail(ctx context.Context) {
	if c == nil || c.done {
		return
	}
	c.rec.State, c.rec.UpdatedAt = StateFailed, c.g.now().UTC()
	c.record(ctx)
}

// record writes the record even if the client has gone, so that its retry
// finds it: under a context that outlives the request.
func (c *CreateOnce) record(ctx context.Context) {
	c.done = true
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if err := c.g.idem.Put(ctx, c.key, c.rec); err != nil {
		// A retry finds sending and is 409 until stale: what the first
		// created stands, and is not created twice.
		c.g.log.Warn("recording the outcome of an idempotent request", "kind", c.rec.Kind, "err", err)
	}
}

// newCreateOnce is r's Idempotency-Key on a create that may take up to
// stale (at least IdempotencyStale is waited for), nil when r has none, or
// the answer when the header is malformed. Keys are the caller's, as those of
// POST /v1/jobs are (IdemKey, scope): one API key's never replays another's.
func (g *Gate) NewCreateOnce(r *http.Request, stale time.Duration) (*CreateOnce, *Error) {
	k, has, e := idempotencyHeader(r)
	if !has || e != nil {
		return nil, e
	}
	Info(r).IdempotencyKey = true
	return &CreateOnce{g: g, key: IdemKey(Scope(r), k), stale: max(stale, g.cfg.IdempotencyStale)}, nil
}

// RequestSum is the digest a create's record keeps of its request: the
// route's, so that a key first used on another route never matches.
func RequestSum(route string, parts ...[]byte) string {
	h := sha256.New()
	h.Write([]byte(route))
	for _, p := range parts {
		h.Write([]byte{0})
		h.Write(p)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// Replayed counts an answer given again from an idempotency record, and
// says so to the client (Idempotent-Replayed).
func (g *Gate) Replayed(w http.ResponseWriter) {
	g.m.replays.Inc()
	w.Header().Set("Idempotent-Replayed", "true")
}

// EncodeJSON is json.Marshal without HTML escaping (it only costs bytes),
// and with every character SQS may refuse written as a JSON escape
// (job.EncodeForSQS, which the subscriber's results go through too).
func EncodeJSON(v any) []byte {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		// Only the publisher's own types are encoded, and they cannot fail.
		panic(fmt.Sprintf("publisher: encoding %T: %v", v, err))
	}
	b := bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
	return job.EncodeForSQS(b)
}
