package taskprotect

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/vramq/vramq/subscriber/taskprotect/taskprotecttest"
)

func minutes(n int) *int { return &n }

// The client against a real local HTTP server playing the agent.
func TestClient(t *testing.T) {
	agent := taskprotecttest.NewAgent(t)
	srv := httptest.NewServer(agent)
	defer srv.Close()
	tp, err := New(srv.URL+"/api/task-1234/", nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()

	for _, tc := range []struct {
		enabled bool
		expiry  time.Duration
		want    *int
	}{
		{true, time.Hour, minutes(60)},
		{true, 90 * time.Second, minutes(2)}, // rounded up
		{true, 0, minutes(1)},
		{true, 72 * time.Hour, minutes(2880)}, // the ECS maximum
		{false, time.Hour, nil},               // no expiry when turning it off
	} {
		agent.ClearPuts()
		if err := tp.Set(ctx, tc.enabled, tc.expiry); err != nil {
			t.Fatalf("Set(%v, %v): %v", tc.enabled, tc.expiry, err)
		}
		puts := agent.Puts()
		if len(puts) != 1 || puts[0].Enabled != tc.enabled || !cmp.Equal(puts[0].Minutes, tc.want) {
			t.Errorf("Set(%v, %v) sent %+v; want ExpiresInMinutes %v", tc.enabled, tc.expiry, puts, tc.want)
		}
	}

	if err := tp.Set(ctx, true, 30*time.Minute); err != nil {
		t.Fatal(err)
	}
	st, err := tp.Get(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !st.ProtectionEnabled || st.ExpirationDate == nil || !strings.HasSuffix(st.TaskArn, "task/vramq/1234") {
		t.Errorf("Get = %+v", st)
	}
	if d := time.Until(*st.ExpirationDate); d < 29*time.Minute || d > 31*time.Minute {
		t.Errorf("expires in %v, want about 30m", d)
	}

	for _, tc := range []struct {
		status     int
		body       string
		wantCode   string
		wantInText []string
	}{
		{http.StatusOK, `{"failure":{"Arn":"arn:task","Detail":null,"Reason":"TASK_NOT_VALID"}}`, "TASK_NOT_VALID",
			[]string{"TASK_NOT_VALID", "only tasks of an ECS service"}},
		{http.StatusBadRequest, `{"requestID":"r-9","error":{"Arn":"arn:task","Code":"AccessDeniedException","Message":"not authorized"}}`,
			"AccessDeniedException", []string{"HTTP 400", "not authorized", "r-9", "ecs:UpdateTaskProtection and ecs:GetTaskProtection"}},
		{http.StatusBadGateway, `bad gateway`, "", []string{"HTTP 502", "bad gateway"}},
	} {
		agent.Fail(1, tc.status, tc.body)
		err := tp.Set(ctx, true, time.Hour)
		var pe *Error
		if !errors.As(err, &pe) || pe.Code != tc.wantCode || pe.StatusCode != tc.status {
			t.Errorf("answer %d %s: err %v; want an Error with code %q", tc.status, tc.body, err, tc.wantCode)
			continue
		}
		for _, s := range tc.wantInText {
			if !strings.Contains(err.Error(), s) {
				t.Errorf("error %q does not say %q", err, s)
			}
		}
	}

	// A 200 that is not the agent's answer is an error, not protection.
	odd := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte(`{}`)) }))
	defer odd.Close()
	tp2, _ := New(odd.URL, nil)
	if err := tp2.Set(ctx, true, time.Hour); err == nil {
		t.Error("an empty answer was taken for protection")
	}

	for _, bad := range []string{"", "169.254.170.2/api/x", "ftp://host/x"} {
		if _, err := New(bad, nil); err == nil {
			t.Errorf("New(%q) accepted", bad)
		}
	}
}
