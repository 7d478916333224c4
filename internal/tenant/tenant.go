// Package tenant names who a job belongs to: the name that goes in a work
// message's MessageGroupId on a standard queue, so that SQS fair queues keep
// one tenant's backlog from raising the others' dwell time, and the label of
// per-tenant metrics, bounded so that untrusted names cannot grow them
// without end.
package tenant

import (
	"crypto/sha256"
	"encoding/hex"
	"sync"
)

// MaxLen is SQS's limit on a MessageGroupId, in characters.
const MaxLen = 128

// Valid reports whether s can name a tenant: 1 to MaxLen characters, each an
// ASCII letter, digit or punctuation mark. That is what SQS accepts in a
// MessageGroupId (SendMessageBatchRequestEntry in the SQS API reference), so
// a valid name is never the reason a send is refused; it has no space or
// control character either, so it is safe in a log line and a label.
func Valid(s string) bool {
	if len(s) == 0 || len(s) > MaxLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; c <= ' ' || c > '~' {
			return false
		}
	}
	return true
}

// OfKey is the tenant of an API key configured without a name: "key-" and
// the first 12 hex digits of the key's SHA-256. It is stable across restarts
// and replicas, so a key keeps its place in SQS's fairness and its metric
// series, and it does not give the key away.
func OfKey(key string) string {
	sum := sha256.Sum256([]byte(key))
	return "key-" + hex.EncodeToString(sum[:6])
}

// The label values that are not a tenant's name. Both hold a space, which
// no valid name does, so no tenant can pose as them.
const (
	None  = "no tenant"     // a job or message with no tenant
	Other = "other tenants" // a tenant past the label limit
)

// Labels maps tenants to metric label values: the first max distinct
// tenants seen, and those named up front, get their own; later ones share
// Other, and an invalid or missing name is None. First come rather than the
// top tenants by traffic, because a counter's series must not change hands:
// a label that moved from one tenant to another would make its rate
// meaningless. The bound matters where anyone can name a tenant (a header
// without auth, a message attribute on the queue); configured keys' names
// are given up front and always have their own.
type Labels struct {
	mu   sync.Mutex
	max  int
	seen map[string]struct{}
}

// NewLabels returns Labels that gives max tenants, beyond those named in
// fixed, a label of their own.
func NewLabels(max int, fixed ...string) *Labels {
	l := &Labels{max: max, seen: make(map[string]struct{}, len(fixed))}
	for _, f := range fixed {
		if Valid(f) {
			l.seen[f] = struct{}{}
		}
	}
	l.max += len(l.seen)
	return l
}

// Label is the label value for tenant t.
func (l *Labels) Label(t string) string {
	if t == "" || !Valid(t) {
		return None
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.seen[t]; ok {
		return t
	}
	if len(l.seen) >= l.max {
		return Other
	}
	l.seen[t] = struct{}{}
	return t
}
