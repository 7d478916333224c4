package publisher_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"mime/multipart"
	"slices"
	"strings"
	"testing"

	"github.com/aws/aws-lambda-go/events"

	"github.com/vramq/vramq/internal/testenv/apigw"
	"github.com/vramq/vramq/publisher"
	"github.com/vramq/vramq/publisher/api"
)

// lambdaCaller sends requests to a Lambda handler as one caller of API
// Gateway, in one payload version, with the identity its authorizer gave.
type lambdaCaller struct {
	name  string
	event func(method, target string, headers map[string]string, body string, b64 bool) any
}

// lambdaAnswer is a response of either payload version: both name these
// fields alike.
type lambdaAnswer struct {
	StatusCode      int               `json:"statusCode"`
	Headers         map[string]string `json:"headers"`
	Body            string            `json:"body"`
	IsBase64Encoded bool              `json:"isBase64Encoded"`
}

// v2Caller is a caller through an HTTP API (payload 2.0) whose authorizer
// gave authz (nil: none).
func v2Caller(name string, authz *events.APIGatewayV2HTTPRequestContextAuthorizerDescription) lambdaCaller {
	return lambdaCaller{name, func(method, target string, headers map[string]string, body string, b64 bool) any {
		ev := apigw.Event(method, target, headers, body)
		ev.IsBase64Encoded = b64
		ev.RequestContext.Authorizer = authz
		return ev
	}}
}

// v1Caller is a caller through a REST API (payload 1.0), set up by set.
func v1Caller(name string, set func(*events.APIGatewayProxyRequestContext)) lambdaCaller {
	return lambdaCaller{name, func(method, target string, headers map[string]string, body string, b64 bool) any {
		ev := apigw.RESTEvent(method, target, headers, body)
		ev.IsBase64Encoded = b64
		set(&ev.RequestContext)
		return ev
	}}
}

// call invokes h with the caller's event, as the Lambda runtime would: the
// event as JSON.
func (c lambdaCaller) call(t *testing.T, h func(context.Context, json.RawMessage) (any, error), method, target string, headers map[string]string, body string, b64 bool) lambdaAnswer {
	t.Helper()
	raw, err := json.Marshal(c.event(method, target, headers, body, b64))
	if err != nil {
		t.Fatal(err)
	}
	out, err := h(t.Context(), raw)
	if err != nil {
		t.Fatalf("%s: %s %s: %v", c.name, method, target, err)
	}
	raw, err = json.Marshal(out)
	if err != nil {
		t.Fatal(err)
	}
	var a lambdaAnswer
	if err := json.Unmarshal(raw, &a); err != nil {
		t.Fatal(err)
	}
	return a
}

// multipartFile is a batch file upload's body and content type.
func multipartFile(t *testing.T, data []byte) (string, string) {
	t.Helper()
	var buf bytes.Buffer
	w := multipart.NewWriter(&buf)
	fw, err := w.CreateFormFile("file", "in.jsonl")
	if err == nil {
		_, err = fw.Write(data)
	}
	if err == nil {
		err = w.WriteField("purpose", "batch")
	}
	if err == nil {
		err = w.Close()
	}
	if err != nil {
		t.Fatal(err)
	}
	return base64.StdEncoding.EncodeToString(buf.Bytes()), w.FormDataContentType()
}

// listed is the ids of a list page.
func listed(t *testing.T, a lambdaAnswer) []string {
	t.Helper()
	var page struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if err := json.Unmarshal([]byte(a.Body), &page); err != nil {
		t.Fatalf("list page %q: %v", a.Body, err)
	}
	var ids []string
	for _, d := range page.Data {
		ids = append(ids, d.ID)
	}
	return ids
}

// Issue 34, item 4: without API keys, files and batches belong to the
// identity API Gateway's authorizer vouched for, through either payload
// version: an IAM principal or a JWT subject (payload 2.0), an IAM
// principal or a Cognito user pool's subject (payload 1.0). Each caller
// lists only its own, and gets 404 on every route for another's, which
// its DELETE and cancel leave as they were. A caller with no identity
// cannot list (401 caller_unknown): it would list every such caller's.
func TestKeylessCallersOwnTheirFilesAndBatches(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true)
	s := e.serve(publisher.Config{})
	h := api.LambdaEventHandler(s.pub.Handler())
	iam := func(arn string) *events.APIGatewayV2HTTPRequestContextAuthorizerDescription {
		return &events.APIGatewayV2HTTPRequestContextAuthorizerDescription{IAM: &events.APIGatewayV2HTTPRequestContextAuthorizerIAMDescription{
			AccountID: "123456789012", UserARN: arn, AccessKey: "ASIAEXAMPLE"}}
	}
	callers := []lambdaCaller{
		v2Caller("v2 IAM alice", iam("arn:aws:iam::123456789012:user/alice")),
		v2Caller("v2 IAM alice-admin", iam("arn:aws:iam::123456789012:user/alice-admin")),
		v2Caller("v2 JWT bob", &events.APIGatewayV2HTTPRequestContextAuthorizerDescription{JWT: &events.APIGatewayV2HTTPRequestContextAuthorizerJWTDescription{
			Claims: map[string]string{"iss": "https://idp.example.com", "sub": "bob"}}}),
		v2Caller("v2 JWT bob of another issuer", &events.APIGatewayV2HTTPRequestContextAuthorizerDescription{JWT: &events.APIGatewayV2HTTPRequestContextAuthorizerJWTDescription{
			Claims: map[string]string{"iss": "https://other.example.com", "sub": "bob"}}}),
		v1Caller("v1 IAM carol", func(rc *events.APIGatewayProxyRequestContext) {
			rc.Identity.UserArn = "arn:aws:sts::123456789012:assumed-role/batch-client/carol"
			rc.Identity.AccountID, rc.Identity.Caller = "123456789012", "AROAEXAMPLE:carol"
		}),
		v1Caller("v1 Cognito dave", func(rc *events.APIGatewayProxyRequestContext) {
			rc.Authorizer = map[string]any{"claims": map[string]any{"iss": "https://cognito-idp.us-east-1.amazonaws.com/us-east-1_EXAMPLE", "sub": "dave"}}
		}),
	}
	anonymous := []lambdaCaller{v2Caller("v2 anonymous", nil), v1Caller("v1 anonymous", func(*events.APIGatewayProxyRequestContext) {})}

	type owned struct{ file, batch string }
	mine := map[string]owned{}
	for _, c := range append(slices.Clone(callers), anonymous[0]) {
		body, ctype := multipartFile(t, batchLines(2, "k"))
		a := c.call(t, h, "POST", "/v1/files", map[string]string{"content-type": ctype}, body, true)
		var f struct{ ID string }
		if a.StatusCode != 200 || json.Unmarshal([]byte(a.Body), &f) != nil {
			t.Fatalf("%s: upload: %d %s", c.name, a.StatusCode, a.Body)
		}
		a = c.call(t, h, "POST", "/v1/batches", map[string]string{"content-type": "application/json"},
			`{"input_file_id":"`+f.ID+`","endpoint":"/v1/embeddings","completion_window":"24h"}`, false)
		var b struct{ ID, Status string }
		if a.StatusCode != 200 || json.Unmarshal([]byte(a.Body), &b) != nil || b.Status != "validating" {
			t.Fatalf("%s: batch: %d %s", c.name, a.StatusCode, a.Body)
		}
		mine[c.name] = owned{f.ID, b.ID}
	}
	mine["v1 anonymous"] = mine["v2 anonymous"]

	everyone := append(slices.Clone(callers), anonymous...)
	for _, c := range everyone {
		for _, o := range everyone {
			if mine[o.name] == mine[c.name] {
				continue
			}
			theirs := mine[o.name]
			for _, r := range []struct{ method, path string }{
				{"GET", "/v1/files/" + theirs.file}, {"GET", "/v1/files/" + theirs.file + "/content"},
				{"DELETE", "/v1/files/" + theirs.file}, {"GET", "/v1/batches/" + theirs.batch},
				{"POST", "/v1/batches/" + theirs.batch + "/cancel"},
			} {
				if a := c.call(t, h, r.method, r.path, nil, "", false); a.StatusCode != 404 || !strings.Contains(a.Body, `"code":"not_found"`) {
					t.Errorf("%s: %s %s of %s's: %d %s; want 404 not_found", c.name, r.method, r.path, o.name, a.StatusCode, a.Body)
				}
			}
			a := c.call(t, h, "POST", "/v1/batches", map[string]string{"content-type": "application/json"},
				`{"input_file_id":"`+theirs.file+`","endpoint":"/v1/embeddings","completion_window":"24h"}`, false)
			if a.StatusCode != 404 || !strings.Contains(a.Body, `"param":"input_file_id"`) {
				t.Errorf("%s: a batch of %s's file: %d %s; want 404 for input_file_id", c.name, o.name, a.StatusCode, a.Body)
			}
		}
	}
	for _, c := range callers {
		own := mine[c.name]
		if got := listed(t, c.call(t, h, "GET", "/v1/files", nil, "", false)); !slices.Equal(got, []string{own.file}) {
			t.Errorf("%s lists files %q; want only its own, %s", c.name, got, own.file)
		}
		if got := listed(t, c.call(t, h, "GET", "/v1/batches?limit=100", nil, "", false)); !slices.Equal(got, []string{own.batch}) {
			t.Errorf("%s lists batches %q; want only its own, %s", c.name, got, own.batch)
		}
		if a := c.call(t, h, "GET", "/v1/batches/"+own.batch, nil, "", false); a.StatusCode != 200 || !strings.Contains(a.Body, `"status":"in_progress"`) {
			t.Errorf("%s: its own batch after the others' cancels: %d %s", c.name, a.StatusCode, a.Body)
		}
		if a := c.call(t, h, "GET", "/v1/files/"+own.file, nil, "", false); a.StatusCode != 200 {
			t.Errorf("%s: its own file after the others' deletes: %d %s", c.name, a.StatusCode, a.Body)
		}
	}
	for _, c := range anonymous {
		for _, path := range []string{"/v1/files", "/v1/batches"} {
			if a := c.call(t, h, "GET", path, nil, "", false); a.StatusCode != 401 || !strings.Contains(a.Body, `"code":"caller_unknown"`) {
				t.Errorf("%s: GET %s: %d %s; want 401 caller_unknown", c.name, path, a.StatusCode, a.Body)
			}
		}
		// An id is still the capability it is for a caller without an
		// identity: the one that made it reads it.
		if a := c.call(t, h, "GET", "/v1/files/"+mine[c.name].file, nil, "", false); a.StatusCode != 200 {
			t.Errorf("%s: the file it uploaded: %d %s", c.name, a.StatusCode, a.Body)
		}
	}
	// Over plain HTTP nothing can claim an identity: the header an
	// authorizer might be imagined to set is only a header.
	r := s.do("GET", "/v1/files", map[string]string{"X-Amzn-Oidc-Identity": "bob", "Authorization": "Bearer x"}, nil)
	if r.status != 401 || !strings.Contains(string(r.body), `"code":"caller_unknown"`) {
		t.Errorf("GET /v1/files over HTTP without keys: %d %s; want 401 caller_unknown", r.status, r.body)
	}
}

// Without keys an Idempotency-Key is the caller identity's own: another
// caller sending the same key and body makes its own job, where it was
// answered the first caller's job (its id, which owns then refused it);
// the same caller again is the replay.
func TestKeylessIdempotencyIsPerCaller(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true)
	s := e.serve(publisher.Config{})
	h := api.LambdaEventHandler(s.pub.Handler())
	iam := func(arn string) *events.APIGatewayV2HTTPRequestContextAuthorizerDescription {
		return &events.APIGatewayV2HTTPRequestContextAuthorizerDescription{IAM: &events.APIGatewayV2HTTPRequestContextAuthorizerIAMDescription{UserARN: arn}}
	}
	alice, bob := v2Caller("alice", iam("arn:aws:iam::123456789012:user/alice")), v2Caller("bob", iam("arn:aws:iam::123456789012:user/bob"))
	body := string(jobBody(t, manyItems("i", 2, 2), 0))
	post := func(c lambdaCaller) (id string, replayed bool) {
		a := c.call(t, h, "POST", "/v1/jobs", map[string]string{"content-type": "application/json", "idempotency-key": "nightly-1"}, body, false)
		var acc accepted
		if a.StatusCode != 202 || json.Unmarshal([]byte(a.Body), &acc) != nil {
			t.Fatalf("%s: POST: %d %s", c.name, a.StatusCode, a.Body)
		}
		return acc.JobID, a.Headers["Idempotent-Replayed"] == "true"
	}
	first, _ := post(alice)
	if id, replayed := post(bob); id == first || replayed {
		t.Errorf("bob's POST with alice's Idempotency-Key: job %s (replayed %v); want a job of his own, not alice's %s", id, replayed, first)
	}
	if id, _ := post(alice); id != first {
		t.Errorf("alice's retry: job %s; want her first, %s", id, first)
	}
}
