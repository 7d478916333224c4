package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/vramq/vramq/internal/tenant"
	"github.com/vramq/vramq/publisher/api"
)

// TestAPIKeysNamed: name:key entries come through each of -api-keys,
// -api-keys-file and -api-keys-secret whole, so the publisher reads each
// key's tenant from them; unnamed keys, the old format, stay keys whole.
func TestAPIKeysNamed(t *testing.T) {
	file := filepath.Join(t.TempDir(), "keys")
	if err := os.WriteFile(file, []byte("# tenants\nglobex:k2\nk3\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	keys, err := apiKeys("acme:k1, acme:k1-next", file)
	if err != nil {
		t.Fatal(err)
	}
	sm := fakeSecretsManager(t, map[string]string{"keys": "initech:k4\nk5, hooli:k6:with:colons"})
	more, err := apiKeysFromSecret(t.Context(), sm, "keys")
	if err != nil {
		t.Fatal(err)
	}
	type named struct{ Name, Key string }
	var got []named
	for _, e := range append(keys, more...) {
		n, k := api.SplitKey(e)
		got = append(got, named{n, k})
	}
	want := []named{{"acme", "k1"}, {"acme", "k1-next"}, {"globex", "k2"}, {tenant.OfKey("k3"), "k3"},
		{"initech", "k4"}, {tenant.OfKey("k5"), "k5"}, {"hooli", "k6:with:colons"}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("tenants and keys (-want +got):\n%s", diff)
	}
}
