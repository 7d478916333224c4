package api

import (
	"context"
	"net/http"
	"strings"

	"github.com/vramq/vramq/internal/tenant"
)

// TenantHeader names a request's tenant on a publisher without API keys.
// With keys it is ignored: the key names the tenant, so a client cannot
// pose as another. Its value is untrusted: it must be a valid tenant name
// (tenant.Valid: what SQS accepts as a MessageGroupId), given once, or the
// request is answered 400 invalid_tenant and nothing is sent.
const TenantHeader = "Vramq-Tenant"

// MaxTenantLabels is how many tenants, beyond the configured keys' names,
// get a per-tenant series of their own (tenant.Labels); later ones are
// counted as "other tenants".
const MaxTenantLabels = 100

// SplitKey reads an APIKeys entry: "name:key" when the part before the
// first colon is a valid tenant name (so it has no space), else the whole
// entry is the key and its tenant is tenant.OfKey(key). A key that itself
// holds a colon must therefore be given with a name ("name:ab:cd").
func SplitKey(entry string) (name, key string) {
	if n, k, ok := strings.Cut(entry, ":"); ok && tenant.Valid(n) {
		return n, k
	}
	return tenant.OfKey(entry), entry
}

type tenantKey struct{}

// withTenant puts the tenant that auth found in ctx.
func withTenant(ctx context.Context, name string) context.Context {
	return context.WithValue(ctx, tenantKey{}, name)
}

// RequestTenant is r's tenant: its key's name when auth is on, else its
// TenantHeader, else "" (no tenant: the messages carry no group id, and
// SQS counts each as a tenant of its own).
func (g *Gate) RequestTenant(r *http.Request) (string, *Error) {
	if len(g.keys) > 0 {
		t, _ := r.Context().Value(tenantKey{}).(string)
		return t, nil
	}
	vs, ok := r.Header[TenantHeader]
	if !ok {
		return "", nil
	}
	if len(vs) != 1 || !tenant.Valid(vs[0]) {
		return "", Err(http.StatusBadRequest, CodeInvalidTenant,
			"%s must be given once, as 1 to %d ASCII letters, digits and punctuation (no spaces)", TenantHeader, tenant.MaxLen)
	}
	return vs[0], nil
}
