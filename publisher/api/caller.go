package api

import (
	"context"
	"net/http"

	"github.com/aws/aws-lambda-go/events"
)

// Who a request's caller is, for what it owns (owner, owns): with API keys,
// the tenant of its key; without keys, the identity API Gateway's
// authorizer vouched for in the Lambda event (CallerIdentity), or nobody.
// Only the Lambda adapter sets the identity, from the event's request
// context, which the client cannot write: no header can pose as one.

type callerKey struct{}

// withCaller puts the identity the Lambda event carried in ctx.
func withCaller(ctx context.Context, identity string) context.Context {
	if identity == "" {
		return ctx
	}
	return context.WithValue(ctx, callerKey{}, identity)
}

// CallerIdentity is the identity withCaller put in r's context, or "".
func CallerIdentity(r *http.Request) string {
	id, _ := r.Context().Value(callerKey{}).(string)
	return id
}

// The identities an authorizer gives, each under its own prefix so that
// no value of one kind can name another kind's owner:
//
//   - "cognito:{identity id}": a Cognito identity pool's caller, whose IAM
//     role (and so userArn) every caller of the pool shares;
//   - "iam:{userArn}": an IAM principal that signed the request (AWS_IAM
//     authorization). An assumed role's ARN ends in its session name, which
//     whoever may assume the role chooses unless the role's trust policy
//     pins it (sts:RoleSessionName): sessions of one role are told apart,
//     but callers that share a role must be trusted alike;
//   - "jwt:{iss} {sub}": the subject of a JWT that an API Gateway JWT
//     authorizer (payload 2.0) or a Cognito user pool authorizer (payload
//     1.0: REST APIs, and HTTP APIs on payload 1.0) checked; the issuer
//     keeps two issuers' subjects apart.
//
// A Lambda authorizer's context names no standard field, so it gives none.

// v2Identity reads the identity of an HTTP API (payload 2.0) or function
// URL event.
func v2Identity(rc *events.APIGatewayV2HTTPRequestContext) string {
	a := rc.Authorizer
	if a == nil {
		return ""
	}
	if a.IAM != nil {
		return iamIdentity(a.IAM.CognitoIdentity.IdentityPoolID, a.IAM.CognitoIdentity.IdentityID, a.IAM.UserARN)
	}
	if a.JWT != nil {
		return jwtIdentity(a.JWT.Claims["iss"], a.JWT.Claims["sub"])
	}
	return ""
}

// v1Identity reads the identity of a REST API (or payload 1.0) event.
func v1Identity(rc *events.APIGatewayProxyRequestContext) string {
	if id := iamIdentity(rc.Identity.CognitoIdentityPoolID, rc.Identity.CognitoIdentityID, rc.Identity.UserArn); id != "" {
		return id
	}
	claims, _ := rc.Authorizer["claims"].(map[string]any)
	iss, _ := claims["iss"].(string)
	sub, _ := claims["sub"].(string)
	return jwtIdentity(iss, sub)
}

func iamIdentity(pool, cognitoID, userARN string) string {
	switch {
	case cognitoID != "":
		return "cognito:" + pool + " " + cognitoID
	case userARN != "":
		return "iam:" + userARN
	}
	return ""
}

func jwtIdentity(iss, sub string) string {
	if sub == "" {
		return ""
	}
	return "jwt:" + iss + " " + sub
}

// CodeNoCaller is the error code of a list route on a publisher that cannot
// tell its callers apart (401).
const CodeNoCaller = "caller_unknown"

// CanList reports whether r's caller may list what it owns: with API keys,
// or with an identity from API Gateway. Without either, every caller is the
// same owner, "", and a listing would hand each the ids of all the others'
// files and batches, which the by-id routes take as proof of ownership.
func (g *Gate) CanList(r *http.Request) *Error {
	if len(g.keys) > 0 || CallerIdentity(r) != "" {
		return nil
	}
	return Err(http.StatusUnauthorized, CodeNoCaller,
		"listing needs to know who the caller is: API keys (-api-keys), or an API Gateway authorizer (IAM or JWT) in front of the Lambda function")
}
