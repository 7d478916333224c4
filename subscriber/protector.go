package subscriber

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// TaskProtection is a client of the ECS container agent's task scale-in
// protection endpoint, $ECS_AGENT_URI/task-protection/v1/state. A protected
// task is not chosen when its service scales in or a deployment replaces
// tasks. The agent makes the ECS UpdateTaskProtection and GetTaskProtection
// calls with the task role's credentials, so the task role needs both
// actions; and only tasks of an ECS service can be protected (a standalone
// task gets a TASK_NOT_VALID failure).
//
// Its methods may be called concurrently. They do not retry: the agent
// already retries its calls to ECS, and the subscriber retries on its own
// schedule.
type TaskProtection struct {
	url    string
	client *http.Client
}

// MaxTaskProtection is the longest protection ECS grants in one call (48 h).
const MaxTaskProtection = 2880 * time.Minute

// protectionCallTimeout bounds one call to the agent, which itself gives up
// on ECS after a few seconds.
const protectionCallTimeout = 15 * time.Second

// NewTaskProtection returns a client of the agent at agentURI, the
// ECS_AGENT_URI the agent puts into every container's environment. A nil
// client means one with a timeout for each call.
func NewTaskProtection(agentURI string, client *http.Client) (*TaskProtection, error) {
	u, err := url.Parse(agentURI)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("ECS agent URI %q: want an http URL such as http://169.254.170.2/api/<id>", agentURI)
	}
	if client == nil {
		client = &http.Client{Timeout: protectionCallTimeout}
	}
	return &TaskProtection{url: strings.TrimSuffix(agentURI, "/") + "/task-protection/v1/state", client: client}, nil
}

// ProtectionState is the task's protection as the agent reports it.
type ProtectionState struct {
	ProtectionEnabled bool
	ExpirationDate    *time.Time // nil when not protected
	TaskArn           string
}

// ProtectionError is an answer of the agent other than the task's state: a
// failure ECS reported for the task (Code is its reason, e.g.
// TASK_NOT_VALID, DEPLOYMENT_BLOCKED) or an error of the call (Code is e.g.
// AccessDeniedException, ThrottlingException, RequestCanceled).
type ProtectionError struct {
	StatusCode int
	Code       string
	Message    string
	TaskArn    string
	RequestID  string
}

func (e *ProtectionError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "ECS task protection: HTTP %d", e.StatusCode)
	if e.Code != "" {
		b.WriteString(": " + e.Code)
	}
	if e.Message != "" {
		b.WriteString(": " + e.Message)
	}
	if e.RequestID != "" {
		b.WriteString(" (request " + e.RequestID + ")")
	}
	// The two causes an operator can fix, named where they show up.
	switch e.Code {
	case "AccessDeniedException":
		b.WriteString("; the task role needs ecs:UpdateTaskProtection and ecs:GetTaskProtection")
	case "TASK_NOT_VALID":
		b.WriteString("; only tasks of an ECS service can be protected")
	}
	return b.String()
}

// Set turns protection on for expiry (rounded up to whole minutes, from 1
// minute to MaxTaskProtection), or off. Setting it on again restarts the
// expiry.
func (p *TaskProtection) Set(ctx context.Context, enabled bool, expiry time.Duration) error {
	req := struct {
		ProtectionEnabled bool
		// Sent only with true: the agent rejects fields it does not know, and
		// an expiry means nothing when turning protection off.
		ExpiresInMinutes *int `json:",omitempty"`
	}{ProtectionEnabled: enabled}
	if enabled {
		m := expiryMinutes(expiry)
		req.ExpiresInMinutes = &m
	}
	body, err := json.Marshal(req)
	if err != nil {
		return err
	}
	st, err := p.call(ctx, http.MethodPut, body)
	if err != nil {
		return err
	}
	if st.ProtectionEnabled != enabled {
		return fmt.Errorf("ECS task protection: set to %v, the agent reports %v", enabled, st.ProtectionEnabled)
	}
	return nil
}

// Get returns the task's protection now.
func (p *TaskProtection) Get(ctx context.Context) (ProtectionState, error) {
	return p.call(ctx, http.MethodGet, nil)
}

func expiryMinutes(d time.Duration) int {
	m := math.Ceil(d.Minutes())
	return int(min(max(m, 1), MaxTaskProtection.Minutes()))
}

func (p *TaskProtection) call(ctx context.Context, method string, body []byte) (ProtectionState, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, p.url, rd)
	if err != nil {
		return ProtectionState{}, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := p.client.Do(req)
	if err != nil {
		return ProtectionState{}, fmt.Errorf("ECS task protection: %w", err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil {
		return ProtectionState{}, fmt.Errorf("ECS task protection: reading the answer: %w", err)
	}
	var ans struct {
		RequestID  *string          `json:"requestID"`
		Protection *ProtectionState `json:"protection"`
		Failure    *struct {
			Arn    string
			Reason string
			Detail *string
		} `json:"failure"`
		Error *struct {
			Arn     string
			Code    string
			Message string
		} `json:"error"`
	}
	jsonErr := json.Unmarshal(raw, &ans)
	pe := &ProtectionError{StatusCode: resp.StatusCode}
	if ans.RequestID != nil {
		pe.RequestID = *ans.RequestID
	}
	switch {
	case jsonErr == nil && ans.Failure != nil:
		pe.Code, pe.TaskArn = ans.Failure.Reason, ans.Failure.Arn
		if ans.Failure.Detail != nil {
			pe.Message = *ans.Failure.Detail
		}
		return ProtectionState{}, pe
	case jsonErr == nil && ans.Error != nil:
		pe.Code, pe.Message, pe.TaskArn = ans.Error.Code, ans.Error.Message, ans.Error.Arn
		return ProtectionState{}, pe
	case resp.StatusCode/100 != 2:
		pe.Message = strings.TrimSpace(string(raw[:min(len(raw), 512)]))
		return ProtectionState{}, pe
	case jsonErr != nil || ans.Protection == nil:
		return ProtectionState{}, fmt.Errorf("ECS task protection: HTTP %d without the task's protection: %.200q", resp.StatusCode, raw)
	}
	return *ans.Protection, nil
}

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
	tp      *TaskProtection
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

func newProtector(tp *TaskProtection, expiry, maxHold time.Duration, held func() int64, m *metrics, log *slog.Logger) *protector {
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
	p.log.Info("task scale-in protection off for a break, though messages are held: a deployment or scale-in waiting for this task may replace it now",
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
	backoff := min(time.Second<<min(p.failures-1, 6), time.Minute)
	p.retryAt = time.Now().Add(backoff)
	p.log.Warn("turning task scale-in protection "+to+" failed; messages are processed regardless",
		"consecutive", p.failures, "retry_in", backoff, "err", err)
}

// clear turns protection off at shutdown, once every message is settled, so
// that ECS may stop the task. Call it after run has returned.
func (p *protector) clear(ctx context.Context) {
	if !p.maybeOn {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, protectionCallTimeout)
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
