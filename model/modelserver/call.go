package modelserver

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/vramq/vramq/job/fault"
)

// maxResponseBytes bounds an answer's body: a batch of embeddings of a few
// thousand dimensions in JSON is a few megabytes.
const maxResponseBytes = 32 << 20

// call is one request to the server.
type call struct {
	ep     endpoint
	body   []byte
	tokens int64 // prompt estimate + max output × choices: the rate reservation
	// floor is the part of tokens that is certain, what any limiter that
	// admits the request charges at least: the exact prompt tokens + max
	// output × choices (the estimate from bytes may overshoot).
	floor int64
	kv    int64 // device bytes it holds while in flight
	// most is the longest answer worth reading whole (run.room): past it
	// the answer's body is not kept, whatever it holds.
	most int64
	// sentAt is when its current try took its rate reservation (zero
	// without one), for rates.sync.
	sentAt time.Time
	prefix string // job.PrefixKey of body, for prefixOrder
}

// outcome is an answer send settled on, with its row.
type outcome struct {
	a   *answer
	row *disposition
}

// errTransient wraps the error of a request that kept failing transiently.
var errTransient = errors.New("model server: transient failure")

// send sends c until an answer settles it (ok, the item's own, too large,
// an embeddings request out of memory) or an error ends it: ctx's, a
// *fault.BackoffError when the server's wait ends past deadline, an
// ErrNeedsOperator, a *tooLargeError for the rate limits, or errTransient
// after Config.MaxRetries. Its waits for a turn end with wait, its
// requests with ctx (see group).
func (m *Model) send(ctx, wait context.Context, c *call, deadline time.Time) (*outcome, error) {
	retries := 0
	for {
		probe, err := m.gate.enter(wait, deadline)
		if err != nil {
			return nil, err
		}
		if err := m.order.wait(wait, c.prefix); err != nil {
			m.gate.abandon(probe)
			return nil, err
		}
		s, err := m.conc.acquire(wait)
		m.order.pass()
		if err != nil {
			m.gate.abandon(probe)
			return nil, err
		}
		res, err := m.rates.take(wait, c.tokens, deadline)
		c.sentAt = res.at
		if err != nil {
			m.conc.release(s, false, false)
			m.gate.abandon(probe)
			return nil, err
		}
		if m.gate.closed(time.Now()) {
			// The server asked for a pause (or an operator) while this
			// request waited for its turn: it goes back to the gate, not
			// out to meet the same answer.
			m.rates.settle(res, 0)
			m.conc.release(s, false, false)
			m.gate.abandon(probe)
			continue
		}
		m.held.Add(c.kv)
		m.order.sending(c.prefix)
		m.online.sending()
		sentAt := time.Now()
		a := m.post(ctx, c)
		m.online.took(time.Since(sentAt))
		m.order.sent(c.prefix)
		m.held.Add(-c.kv)
		if a == nil {
			m.rates.settle(res, 0)
			m.conc.release(s, false, false)
			m.gate.abandon(probe)
			return nil, ctx.Err()
		}
		row := classify(a)
		m.count(row)
		used := int64(0)
		if row.action == actOK {
			u := usageOf(a.body)
			used = u.TotalTokens
			if used == 0 {
				used = int64(res.tokens) // no usage: keep the reservation
			}
			m.rates.charged(res, u.PromptTokens, c.floor)
		}
		m.rates.settle(res, used)
		genOOM := row.action == actOOM && c.ep != embeddings
		m.conc.release(s, row.action == actOverloaded || genOOM, row.action == actOK)
		now := time.Now()
		switch row.action {
		case actOK, actItem, actTooLarge, actOOM:
			if !genOOM {
				m.gate.answered()
				m.gate.leave(probe, time.Time{}, "", nil)
				return &outcome{a, row}, nil
			}
			fallthrough // generation out of memory: fewer in flight, and again
		case actTransient:
			m.gate.leave(probe, time.Time{}, "", nil)
			if retries++; retries > m.cfg.MaxRetries {
				return nil, fmt.Errorf("%w: %s %s after %d tries: %s", errTransient, row.name, c.ep.path(), retries, a.describe(false))
			}
			delay := m.waits.retry(retries)
			if now.Add(delay).After(deadline) {
				return nil, fmt.Errorf("%w: %s %s, and no time left to retry: %s", errTransient, row.name, c.ep.path(), a.describe(false))
			}
			if err := sleep(wait, delay, nil); err != nil {
				return nil, err
			}
		case actWait:
			m.rates.limited()
			d, ok := m.retryAfter(a.header, now)
			if !ok {
				d = m.gate.overloaded()
			}
			m.gate.leave(probe, now.Add(d), "429 "+orString(a.errCode, "rate limited"), nil)
		case actOverloaded:
			d, ok := m.retryAfter(a.header, now)
			if !ok {
				d = m.gate.overloaded()
			}
			m.gate.leave(probe, now.Add(d), row.name+" "+a.statusText(), nil)
		case actOperator:
			err := fmt.Errorf("%w: the model server answered %s (%s): %s", fault.ErrNeedsOperator, a.statusText(), row.name, a.describe(false))
			if m.gate.latch(probe, err) {
				m.log.Error("the model server refuses every request until someone acts", "answer", row.name, "status", a.status,
					"type", a.errType, "code", a.errCode)
			}
			return nil, err
		}
	}
}

// post sends c once. It returns nil when ctx ended, with nothing to learn
// from; a request that timed out or lost its connection is an answer with
// err set.
func (m *Model) post(ctx context.Context, c *call) *answer {
	rctx, cancel := context.WithTimeout(ctx, m.cfg.RequestTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(rctx, http.MethodPost, m.base+c.ep.path(), bytes.NewReader(c.body))
	if err != nil {
		return &answer{ep: c.ep, err: err}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json")
	if m.auth != "" {
		req.Header.Set("Authorization", m.auth)
	}
	resp, err := m.client.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return &answer{ep: c.ep, err: err}
	}
	defer resp.Body.Close()
	// Any transport's body read ends with the request's time, not only
	// net/http's own.
	stop := context.AfterFunc(rctx, func() { resp.Body.Close() })
	defer stop()
	// The headers are the freshest word on the limits: every other
	// request waits on them, not on this one's body.
	m.rates.sync(resp.Header, time.Now(), resp.StatusCode/100 == 2, float64(c.floor), c.sentAt)
	most := min(int64(maxResponseBytes), c.most)
	body, err := io.ReadAll(io.LimitReader(resp.Body, most+1))
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return &answer{ep: c.ep, err: fmt.Errorf("reading the answer: %w", err)}
	}
	var cut int64
	if int64(len(body)) > most {
		body, cut = nil, most // not kept, whatever it was
	}
	return &answer{ep: c.ep, status: resp.StatusCode, header: resp.Header, body: body, cut: cut}
}

// usage is an answer's usage object.
type usage struct {
	PromptTokens     int64 `json:"prompt_tokens"`
	CompletionTokens int64 `json:"completion_tokens"`
	TotalTokens      int64 `json:"total_tokens"`
}

func usageOf(body []byte) usage {
	var v struct {
		Usage usage `json:"usage"`
	}
	_ = json.Unmarshal(body, &v)
	if v.Usage.TotalTokens == 0 {
		v.Usage.TotalTokens = v.Usage.PromptTokens + v.Usage.CompletionTokens
	}
	return v.Usage
}

func (a *answer) statusText() string {
	if a.err != nil {
		return "no answer"
	}
	return fmt.Sprintf("%d %s", a.status, http.StatusText(a.status))
}

func orString(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
