// Package taskprotect is a client of the ECS container agent's task scale-in
// protection endpoint: what keeps ECS from stopping a task that is busy.
package taskprotect

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// Client is a client of the ECS container agent's task scale-in
// protection endpoint, $ECS_AGENT_URI/task-protection/v1/state. A protected
// task is not chosen when its service scales in or a deployment replaces
// tasks. The agent makes the ECS UpdateTaskProtection and GetTaskProtection
// calls with the task role's credentials, so the task role needs both
// actions; and only tasks of an ECS service can be protected (a standalone
// task gets a TASK_NOT_VALID failure).
//
// Its methods may be called concurrently. They do not retry: the agent
// already retries its calls to ECS, and its callers retry on their own
// schedule.
type Client struct {
	url    string
	client *http.Client
}

// MaxExpiry is the longest protection ECS grants in one call (48 h).
const MaxExpiry = 2880 * time.Minute

// CallTimeout bounds one call to the agent, which itself gives up on ECS
// after a few seconds: New's default client's timeout.
const CallTimeout = 15 * time.Second

// New returns a client of the agent at agentURI, the
// ECS_AGENT_URI the agent puts into every container's environment. A nil
// client means one with a timeout for each call.
func New(agentURI string, client *http.Client) (*Client, error) {
	u, err := url.Parse(agentURI)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("ECS agent URI %q: want an http URL such as http://169.254.170.2/api/<id>", agentURI)
	}
	if client == nil {
		client = &http.Client{Timeout: CallTimeout}
	}
	return &Client{url: strings.TrimSuffix(agentURI, "/") + "/task-protection/v1/state", client: client}, nil
}

// State is the task's protection as the agent reports it.
type State struct {
	ProtectionEnabled bool
	ExpirationDate    *time.Time // nil when not protected
	TaskArn           string
}

// Error is an answer of the agent other than the task's state: a
// failure ECS reported for the task (Code is its reason, e.g.
// TASK_NOT_VALID, DEPLOYMENT_BLOCKED) or an error of the call (Code is e.g.
// AccessDeniedException, ThrottlingException, RequestCanceled).
type Error struct {
	StatusCode int
	Code       string
	Message    string
	TaskArn    string
	RequestID  string
}

func (e *Error) Error() string {
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
// minute to MaxExpiry), or off. Setting it on again restarts the
// expiry.
func (p *Client) Set(ctx context.Context, enabled bool, expiry time.Duration) error {
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
func (p *Client) Get(ctx context.Context) (State, error) {
	return p.call(ctx, http.MethodGet, nil)
}

func expiryMinutes(d time.Duration) int {
	m := math.Ceil(d.Minutes())
	return int(min(max(m, 1), MaxExpiry.Minutes()))
}

func (p *Client) call(ctx context.Context, method string, body []byte) (State, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, p.url, rd)
	if err != nil {
		return State{}, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := p.client.Do(req)
	if err != nil {
		return State{}, fmt.Errorf("ECS task protection: %w", err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil {
		return State{}, fmt.Errorf("ECS task protection: reading the answer: %w", err)
	}
	var ans struct {
		RequestID  *string `json:"requestID"`
		Protection *State  `json:"protection"`
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
	pe := &Error{StatusCode: resp.StatusCode}
	if ans.RequestID != nil {
		pe.RequestID = *ans.RequestID
	}
	switch {
	case jsonErr == nil && ans.Failure != nil:
		pe.Code, pe.TaskArn = ans.Failure.Reason, ans.Failure.Arn
		if ans.Failure.Detail != nil {
			pe.Message = *ans.Failure.Detail
		}
		return State{}, pe
	case jsonErr == nil && ans.Error != nil:
		pe.Code, pe.Message, pe.TaskArn = ans.Error.Code, ans.Error.Message, ans.Error.Arn
		return State{}, pe
	case resp.StatusCode/100 != 2:
		pe.Message = strings.TrimSpace(string(raw[:min(len(raw), 512)]))
		return State{}, pe
	case jsonErr != nil || ans.Protection == nil:
		return State{}, fmt.Errorf("ECS task protection: HTTP %d without the task's protection: %.200q", resp.StatusCode, raw)
	}
	return *ans.Protection, nil
}
