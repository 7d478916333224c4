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
	kv    int64 // KV tokens it holds while in flight
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
		o, failed, err := m.try(ctx, wait, c, deadline)
		if err != nil || o != nil {
			return o, err
		}
		if failed == nil {
			continue // to the gate's pause, or past the pause that came
		}
		a, row := failed.a, failed.row
		if retries++; retries > m.cfg.MaxRetries {
			return nil, pastRetries(row, fmt.Errorf("%w: %s %s after %d tries: %s", errTransient, row.name, c.ep.path(), retries, a.describe(false)))
		}
		delay := m.waits.retry(retries)
		if time.Now().Add(delay).After(deadline) {
			return nil, pastRetries(row, fmt.Errorf("%w: %s %s, and no time left to retry: %s", errTransient, row.name, c.ep.path(), a.describe(false)))
		}
		if err := sleep(wait, delay, nil); err != nil {
			return nil, err
		}
	}
}

// try sends c once, within a turn it holds until it returns. It returns
// the outcome that settles c, or an error that ends it, or neither: c is
// to be sent again, after the retry delay when the answer failed
// transiently (failed), else through the gate, which holds it for the
// pause the answer asked for or that came while it waited for its turn.
func (m *Model) try(ctx, wait context.Context, c *call, deadline time.Time) (settled, failed *outcome, err error) {
	t, err := m.takeTurn(wait, c, deadline)
	if err != nil {
		return nil, nil, err
	}
	defer t.end()
	if m.gate.closed(time.Now()) {
		// The server asked for a pause (or an operator) while this
		// request waited for its turn: it goes back to the gate, not
		// out to meet the same answer.
		return nil, nil, nil
	}
	m.held.Add(c.kv)
	m.order.sending(c.prefix)
	m.online.sending()
	sent := time.Now()
	a := m.post(ctx, c)
	m.online.took(time.Since(sent))
	m.order.sent(c.prefix)
	m.held.Add(-c.kv)
	if a == nil {
		return nil, nil, ctx.Err()
	}
	row := classify(a)
	m.count(row)
	t.answered = true
	now := time.Now()
	switch row.action {
	case actOK, actItem, actTooLarge, actOOM:
		if row.action == actOK {
			u := usageOf(a.body)
			t.used = u.TotalTokens
			t.clean = true
			m.took.observe(now.Sub(sent))
			m.rates.charged(t.res, u.PromptTokens, c.floor, u.TotalTokens, a.header)
		}
		if row.action != actOOM || c.ep == embeddings {
			m.gate.answered()
			return &outcome{a, row}, nil, nil
		}
		// Generation out of memory: fewer in flight, and again.
		t.overloaded = true
		failed = &outcome{a, row}
	case actTransient, actTimeout:
		failed = &outcome{a, row}
	case actWait:
		d, ok := m.retryAfter(a.header, now)
		if !ok {
			d = m.gate.overloaded()
		}
		t.until, t.reason = now.Add(d), "429 "+orString(a.errCode, "rate limited")
		m.rates.limited(t.res, t.until)
	case actOverloaded:
		t.overloaded = true
		d, ok := m.retryAfter(a.header, now)
		if !ok {
			d = m.gate.overloaded()
		}
		t.until, t.reason = now.Add(d), row.name+" "+a.statusText()
	case actOperator:
		t.opErr = fmt.Errorf("%w: the model server answered %s (%s): %s", fault.ErrNeedsOperator, a.statusText(), row.name, a.describe(false))
		t.onLatch = func() {
			m.log.Error("the model server refuses every request until someone acts", "answer", row.name, "status", a.status,
				"type", a.errType, "code", a.errCode)
		}
		return nil, nil, t.opErr
	}
	return nil, failed, nil
}

// A turn is what one try of a request holds: the gate's probe (the
// request that goes alone), a concurrency slot and a rate reservation.
// takeTurn takes them together, and end gives back what was taken, once,
// with what the answer taught each: the tokens it used, whether the server
// was overloaded or answered clean, and the pause or the operator's error
// it asked for.
type turn struct {
	m       *Model
	probe   bool
	slot    *slot
	res     reservation
	settled bool

	answered   bool  // the server answered: the gate learns from the fields below
	used       int64 // tokens the answer used, 0 for none (an answer without usage keeps the reservation)
	overloaded bool
	clean      bool
	until      time.Time // a pause the answer asked for
	reason     string
	opErr      error  // the answer needs an operator
	onLatch    func() // called when opErr closes a gate that was open
}

// takeTurn waits for the gate, the prefix order's pass, a concurrency slot
// and the rate limits, in that order, under wait; on an error it holds
// nothing.
func (m *Model) takeTurn(wait context.Context, c *call, deadline time.Time) (t *turn, err error) {
	probe, err := m.gate.enter(wait, deadline)
	if err != nil {
		return nil, err
	}
	t = &turn{m: m, probe: probe}
	defer func() {
		if err != nil {
			t.end()
			t = nil
		}
	}()
	if err := m.order.wait(wait, c.prefix); err != nil {
		return t, err
	}
	s, err := m.conc.acquire(wait)
	m.order.pass()
	if err != nil {
		return t, err
	}
	t.slot = &s
	t.res, err = m.rates.take(wait, c.tokens, deadline)
	c.sentAt = t.res.at
	return t, err
}

// end gives back what t holds: the rate reservation settled at what the
// answer used, the slot with what the answer said of the server's load,
// and the gate's probe with the pause or the error the answer brought, or
// passed on unanswered. A second call does nothing.
func (t *turn) end() {
	if t.settled {
		return
	}
	t.settled = true
	m := t.m
	used := t.used
	if t.clean && used == 0 {
		used = int64(t.res.tokens) // no usage: keep the reservation
	}
	m.rates.settle(t.res, used)
	if t.slot != nil {
		m.conc.release(*t.slot, t.overloaded, t.clean)
	}
	switch {
	case !t.answered:
		m.gate.abandon(t.probe)
	case t.opErr != nil:
		if m.gate.latch(t.probe, t.opErr) && t.onLatch != nil {
			t.onLatch()
		}
	default:
		m.gate.leave(t.probe, t.until, t.reason, nil)
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
	if c.ep == messages {
		req.Header.Set("anthropic-version", anthropicVersion)
	}
	resp, err := m.client.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return &answer{ep: c.ep, err: deadlineOf(rctx, err)}
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
		return &answer{ep: c.ep, err: fmt.Errorf("reading the answer: %w", deadlineOf(rctx, err))}
	}
	var cut int64
	if int64(len(body)) > most {
		body, cut = nil, most // not kept, whatever it was
	}
	return &answer{ep: c.ep, status: resp.StatusCode, header: resp.Header, body: body, cut: cut}
}

// usage is an answer's usage object: OpenAI's, or Anthropic's input_tokens
// and output_tokens (a native Messages answer), read as its prompt and
// completion tokens.
type usage struct {
	PromptTokens     int64 `json:"prompt_tokens"`
	CompletionTokens int64 `json:"completion_tokens"`
	TotalTokens      int64 `json:"total_tokens"`
	InputTokens      int64 `json:"input_tokens"`
	OutputTokens     int64 `json:"output_tokens"`
}

func usageOf(body []byte) usage {
	var v struct {
		Usage usage `json:"usage"`
	}
	_ = json.Unmarshal(body, &v)
	if v.Usage.PromptTokens == 0 && v.Usage.CompletionTokens == 0 {
		v.Usage.PromptTokens, v.Usage.CompletionTokens = v.Usage.InputTokens, v.Usage.OutputTokens
	}
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
