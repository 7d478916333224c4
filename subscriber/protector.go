package subscriber

import (
	"context"
	"log/slog"
	"time"

	"github.com/vramq/vramq/internal/backoff"
	"github.com/vramq/vramq/subscriber/taskprotect"
)

// TaskProtection turns the ECS task's scale-in protection on for expiry, or
// off; *taskprotect.Client does it through the ECS container agent. Set may
// fail: the protector counts the failure and tries again later.
type TaskProtection interface {
	Set(ctx context.Context, enabled bool, expiry time.Duration) error
}

var _ TaskProtection = (*taskprotect.Client)(nil)

// MaxTaskProtection is the longest protection ECS grants in one call (48 h),
// the bound on Config's TaskProtectionExpiry and TaskProtectionMaxHold.
const MaxTaskProtection = taskprotect.MaxExpiry

// protector keeps the task protected from scale-in while the subscriber holds
// messages. It turns protection on when the first message is held, renews it
// at half its expiry while any is, and turns it off once none has been held
// for protectionIdle, so a queue that trickles does not flip it on every
// message. Failed calls are counted and retried with backoff; they never hold
// up messages: protection is a courtesy to ECS, not a precondition for work.
// Between receiving a message and the agent's answer the task is not yet
// protected; a scale-in in that window stops it the ordinary way (SIGTERM),
// and shutdown hands the message back.
type protector struct {
	tp      TaskProtection
	expiry  time.Duration
	idle    time.Duration
	maxHold time.Duration // the longest protection stays on without a break
	held    func() int64
	m       *metrics
	log     *slog.Logger
	kick    chan struct{}

	// Owned by run, then by clear.
	on        bool      // the agent confirmed protection on, and it has not expired
	maybeOn   bool      // an enable was sent and no disable has succeeded since
	renewAt   time.Time // when to renew while messages are held
	expiresAt time.Time // when the last protection confirmed runs out
	idleSince time.Time // when the subscriber last went to holding nothing; zero while holding
	failures  int       // consecutive failed calls
	retryAt   time.Time // no call before this, after a failure
	onSince   time.Time // when protection last went on
	breakEnds time.Time // protection stays off until then, whatever is held
}

// protectionIdle is how long the subscriber holds nothing before protection
// is turned off: longer than a long poll, so a steady queue keeps it on.
const protectionIdle = 30 * time.Second

// protectionBreak is how long protection stays off after it has been on for
// maxHold. ECS never stops a protected task, for a deployment either: under
// steady load a subscriber that renewed for ever would never be replaced by
// a new version. During a break a waiting deployment or scale-in may stop
// this task the ordinary way (SIGTERM), and shutdown hands back what it
// holds, so the break costs at most a redelivery. Two minutes leaves ECS's
// scheduler several looks at the task; a deployment that waited on it waits
// at most maxHold plus this.
const protectionBreak = 2 * time.Minute

// protectRetry is the wait after failed protection calls in a row: 1 s,
// doubled up to a minute. Protection is one task's own state, so no crowd
// of tasks needs spreading.
var protectRetry = backoff.Policy{First: time.Second, Max: time.Minute}

func newProtector(tp TaskProtection, expiry, maxHold time.Duration, held func() int64, m *metrics, log *slog.Logger) *protector {
	return &protector{tp: tp, expiry: expiry, maxHold: maxHold, idle: protectionIdle, held: held, m: m, log: log, kick: make(chan struct{}, 1)}
}

// poke tells the protector that the number of messages held has changed.
func (p *protector) poke() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// run follows the held count until ctx ends.
func (p *protector) run(ctx context.Context) {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for ctx.Err() == nil {
		wait, ok := p.step(ctx, time.Now())
		var fire <-chan time.Time
		if ok {
			timer.Reset(wait)
			fire = timer.C
		}
		select {
		case <-ctx.Done():
			return
		case <-p.kick:
		case <-fire:
		}
	}
}

// step makes the call the held count asks for now, if any, and says how long
// until the next one is due; ok is false when nothing is due until the held
// count changes.
func (p *protector) step(ctx context.Context, now time.Time) (wait time.Duration, ok bool) {
	if p.on && !now.Before(p.expiresAt) {
		// Renewals kept failing: ECS has let the protection lapse.
		p.on = false
		p.m.protected.Set(0)
	}
	holding := p.held() > 0
	breakAt := p.onSince.Add(p.maxHold)
	var due time.Time // zero: nothing to do
	switch {
	case holding && now.Before(p.breakEnds):
		p.idleSince = time.Time{}
		due = p.breakEnds
	case holding:
		p.idleSince = time.Time{}
		due = now
		if p.on {
			due = p.renewAt
			if breakAt.Before(due) {
				due = breakAt
			}
		}
	case p.maybeOn:
		if p.idleSince.IsZero() {
			p.idleSince = now
		}
		due = p.idleSince.Add(p.idle)
	default:
		return 0, false
	}
	if due.Before(p.retryAt) {
		due = p.retryAt
	}
	if now.Before(due) {
		if p.on && p.expiresAt.Before(due) {
			due = p.expiresAt // to report the lapse when it happens
		}
		return due.Sub(now), true
	}
	switch {
	case holding && p.on && !now.Before(breakAt):
		p.takeBreak(ctx, now)
	case holding:
		p.enable(ctx, now)
	default:
		p.disable(ctx)
	}
	return 0, true // look again at once: the held count may have moved during the call
}

func (p *protector) enable(ctx context.Context, now time.Time) {
	p.maybeOn = true
	if err := p.tp.Set(ctx, true, p.expiry); err != nil {
		p.failed(ctx, "on", err)
		return
	}
	if !p.on {
		p.onSince = now
		p.log.Info("task scale-in protection on: messages held", "expires_in", p.expiry)
	} else {
		p.log.Debug("task scale-in protection renewed", "expires_in", p.expiry)
	}
	p.on, p.renewAt, p.expiresAt = true, now.Add(p.expiry/2), now.Add(p.expiry)
	p.succeeded()
}

func (p *protector) disable(ctx context.Context) {
	if err := p.tp.Set(ctx, false, 0); err != nil {
		p.failed(ctx, "off", err)
		return
	}
	p.log.Info("task scale-in protection off: no messages held", "idle", p.idle)
	p.on, p.maybeOn = false, false
	p.succeeded()
}

// takeBreak turns protection off for protectionBreak although messages are
// held: it has been on for maxHold (see protectionBreak).
func (p *protector) takeBreak(ctx context.Context, now time.Time) {
	if err := p.tp.Set(ctx, false, 0); err != nil {
		p.failed(ctx, "off for a break", err)
		return
	}
	p.log.Info("task scale-in protection off for a break, though messages are held: "+
		"a deployment or scale-in waiting for this task may replace it now",
		"on_for", now.Sub(p.onSince).Round(time.Second), "break", protectionBreak)
	p.on, p.maybeOn, p.breakEnds = false, false, now.Add(protectionBreak)
	p.succeeded()
}

func (p *protector) succeeded() {
	p.failures, p.retryAt = 0, time.Time{}
	p.m.protected.Set(boolGauge(p.on))
}

func (p *protector) failed(ctx context.Context, to string, err error) {
	if ctx.Err() != nil {
		return // stopping: clear takes over
	}
	p.failures++
	p.m.protectionErrors.Inc()
	wait := protectRetry.Delay(p.failures)
	p.retryAt = time.Now().Add(wait)
	p.log.Warn("turning task scale-in protection "+to+" failed; messages are processed regardless",
		"consecutive", p.failures, "retry_in", wait, "err", err)
}

// clear turns protection off at shutdown, once every message has ended, so
// that ECS may stop the task. Call it after run has returned.
func (p *protector) clear(ctx context.Context) {
	if !p.maybeOn {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, taskprotect.CallTimeout)
	defer cancel()
	if err := p.tp.Set(ctx, false, 0); err != nil {
		p.m.protectionErrors.Inc()
		p.log.Warn("turning task scale-in protection off at shutdown failed; it expires on its own", "err", err)
		return
	}
	p.log.Info("task scale-in protection off: shut down")
	p.on, p.maybeOn = false, false
	p.m.protected.Set(0)
}

func boolGauge(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
