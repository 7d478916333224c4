package publisher

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
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
	stateSending  = "sending"
	stateAccepted = "accepted"
	stateFailed   = "failed"
)

// maxIdempotencyKey bounds the header; the IETF draft suggests a UUID.
const maxIdempotencyKey = 255

type idemRecord struct {
	V             int           `json:"v"`
	JobID         string        `json:"job_id"`
	RequestSHA256 string        `json:"request_sha256"`
	State         string        `json:"state"`
	CreatedAt     time.Time     `json:"created_at"`
	UpdatedAt     time.Time     `json:"updated_at"`
	Response      *acceptedBody `json:"response,omitempty"`
}

// idemStore keeps idempotency records. claim stores rec unless a record is
// already there, which it returns instead; put overwrites.
type idemStore interface {
	claim(ctx context.Context, key string, rec idemRecord) (existing *idemRecord, err error)
	put(ctx context.Context, key string, rec idemRecord) error
}

// idemKey is the name a header value is kept under: hex SHA-256 of the
// caller's scope and the key, so neither is stored in the clear.
func idemKey(scope, header string) string {
	sum := sha256.Sum256([]byte(scope + "\x00" + header))
	return hex.EncodeToString(sum[:])
}

// validIdempotencyKey accepts 1 to 255 visible ASCII characters.
func validIdempotencyKey(k string) bool {
	if k == "" || len(k) > maxIdempotencyKey {
		return false
	}
	for i := 0; i < len(k); i++ {
		if k[i] < 0x21 || k[i] > 0x7e {
			return false
		}
	}
	return true
}

// s3Idem keeps records in the payload bucket, shared by every publisher
// process and Lambda instance. The claim is S3's conditional put
// (If-None-Match), so of two concurrent first requests only one proceeds.
// Records do not expire by themselves: give the idempotency/ prefix a
// lifecycle rule.
type s3Idem struct{ store *payload.Store }

func (s s3Idem) claim(ctx context.Context, key string, rec idemRecord) (*idemRecord, error) {
	created, existing, err := s.store.PutIfAbsent(ctx, job.IdempotencyKey(key), encodeJSON(rec))
	if err != nil || created {
		return nil, err
	}
	var old idemRecord
	if err := json.Unmarshal(existing, &old); err != nil {
		return nil, fmt.Errorf("idempotency record %s: %w", job.IdempotencyKey(key), err)
	}
	return &old, nil
}

func (s s3Idem) put(ctx context.Context, key string, rec idemRecord) error {
	_, err := s.store.Put(ctx, job.IdempotencyKey(key), encodeJSON(rec))
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
	rec     idemRecord
	expires time.Time
	seq     uint64
}

type memOrder struct {
	key string
	seq uint64
}

func newMemIdem(ttl time.Duration, max int) *memIdem {
	return &memIdem{ttl: ttl, max: max, now: time.Now, recs: map[string]memEntry{}}
}

func (m *memIdem) claim(_ context.Context, key string, rec idemRecord) (*idemRecord, error) {
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

func (m *memIdem) put(_ context.Context, key string, rec idemRecord) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.store(key, rec, m.now())
	return nil
}

func (m *memIdem) store(key string, rec idemRecord, now time.Time) {
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
