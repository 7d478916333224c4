package subscriber

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"sync"

	"github.com/vramq/vramq/internal/payload"
	"github.com/vramq/vramq/job"
)

// memPayloads is an in-memory payload bucket with the verification of
// payload.Store.Get, for unit tests of the claim-check paths.
type memPayloads struct {
	mu   sync.Mutex
	objs map[string][]byte
	// getHook, when set, runs before each Get looks at the object; an error
	// it returns is the Get's. It may block (until ctx ends, say).
	getHook func(ctx context.Context, key string) error
	// putErr, when set, decides the error of each Put and PutIfAbsent.
	putErr func(key string) error

	active, maxActive int            // Gets in flight now, and the most at once
	reads             map[string]int // Reads, by key
	// readErr, when set, decides the error of each Read.
	readErr func(key string) error
	// listHook, when set, runs before each List returns its n keys; an
	// error it returns is the List's. It may sleep (an S3 page's latency).
	listHook func(ctx context.Context, prefix string, n int) error
	listed   map[string]int // keys returned by List, by the prefix's job (the second path element)
}

var _ Payloads = (*memPayloads)(nil)

func newMemPayloads() *memPayloads { return &memPayloads{objs: map[string][]byte{}} }

func (p *memPayloads) Bucket() string { return "mem" }

func (p *memPayloads) Get(ctx context.Context, ref job.PayloadRef) ([]byte, error) {
	p.mu.Lock()
	p.active++
	p.maxActive = max(p.maxActive, p.active)
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		p.active--
		p.mu.Unlock()
	}()
	if p.getHook != nil {
		if err := p.getHook(ctx, ref.Key); err != nil {
			return nil, err
		}
	}
	b, ok := p.object(ref.Key)
	switch {
	case !ok:
		return nil, fmt.Errorf("%w: s3://%s/%s", payload.ErrMissing, ref.Bucket, ref.Key)
	case int64(len(b)) != ref.Size:
		return nil, fmt.Errorf("%w: s3://%s/%s is %d bytes, reference says %d", payload.ErrCorrupt, ref.Bucket, ref.Key, len(b), ref.Size)
	}
	sum := sha256.Sum256(b)
	if got := hex.EncodeToString(sum[:]); got != ref.SHA256 {
		return nil, fmt.Errorf("%w: s3://%s/%s has sha256 %s, reference says %s", payload.ErrCorrupt, ref.Bucket, ref.Key, got, ref.SHA256)
	}
	return b, nil
}

func (p *memPayloads) Put(ctx context.Context, key string, body []byte) (job.PayloadRef, error) {
	if p.putErr != nil {
		if err := p.putErr(key); err != nil {
			return job.PayloadRef{}, err
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.objs[key] = append([]byte(nil), body...)
	return refTo(p.Bucket(), key, body), nil
}

func (p *memPayloads) PutIfAbsent(ctx context.Context, key string, body []byte) (bool, []byte, error) {
	if p.putErr != nil {
		if err := p.putErr(key); err != nil {
			return false, nil, err
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if b, ok := p.objs[key]; ok {
		return false, b, nil
	}
	p.objs[key] = append([]byte(nil), body...)
	return true, nil, nil
}

// Create is PutIfAbsent: the map's check and write are one step, as S3's
// conditional write is.
func (p *memPayloads) Create(ctx context.Context, key string, body []byte) (bool, []byte, error) {
	return p.PutIfAbsent(ctx, key, body)
}

func (p *memPayloads) Read(ctx context.Context, key string) ([]byte, error) {
	p.mu.Lock()
	if p.reads == nil {
		p.reads = map[string]int{}
	}
	p.reads[key]++
	p.mu.Unlock()
	if p.readErr != nil {
		if err := p.readErr(key); err != nil {
			return nil, err
		}
	}
	b, ok := p.object(key)
	if !ok {
		return nil, fmt.Errorf("%w: s3://%s/%s", payload.ErrMissing, p.Bucket(), key)
	}
	return b, nil
}

// readsOf is how many times key was Read.
func (p *memPayloads) readsOf(key string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.reads[key]
}

func (p *memPayloads) object(key string) ([]byte, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	b, ok := p.objs[key]
	return b, ok
}

func (p *memPayloads) maxInFlight() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.maxActive
}
