package main

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/secretsmanager"
	"github.com/google/go-cmp/cmp"
)

// fakeSecretsManager answers GetSecretValue as Secrets Manager's JSON 1.1
// protocol does, so the test runs the real SDK client end to end.
func fakeSecretsManager(t *testing.T, secrets map[string]string) *secretsmanager.Client {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if got := r.Header.Get("X-Amz-Target"); got != "secretsmanager.GetSecretValue" {
			t.Errorf("X-Amz-Target %q", got)
		}
		var in struct{ SecretId string }
		if err := json.NewDecoder(r.Body).Decode(&in); err != nil {
			t.Errorf("request body: %v", err)
		}
		w.Header().Set("Content-Type", "application/x-amz-json-1.1")
		s, ok := secrets[in.SecretId]
		if !ok {
			w.WriteHeader(http.StatusBadRequest)
			json.NewEncoder(w).Encode(map[string]string{"__type": "ResourceNotFoundException",
				"message": "Secrets Manager can't find the specified secret."})
			return
		}
		json.NewEncoder(w).Encode(map[string]any{"ARN": "arn:aws:secretsmanager:us-east-1:123456789012:secret:" + in.SecretId,
			"Name": in.SecretId, "SecretString": s})
	}))
	t.Cleanup(srv.Close)
	return secretsmanager.New(secretsmanager.Options{
		Region: "us-east-1", BaseEndpoint: aws.String(srv.URL),
		Credentials: aws.AnonymousCredentials{}, RetryMaxAttempts: 1,
	})
}

func TestAPIKeysFromSecret(t *testing.T) {
	sm := fakeSecretsManager(t, map[string]string{
		"keys":  "k1, k2\n# rotated out: old\nk3\n",
		"empty": " ,\n# nothing\n",
	})
	keys, err := apiKeysFromSecret(t.Context(), sm, "keys")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"k1", "k2", "k3"}, keys); diff != "" {
		t.Errorf("keys (-want +got):\n%s", diff)
	}
	// Fail closed: a secret naming no key, or one that cannot be read, stops
	// the start; an error never carries the secret's content.
	for _, id := range []string{"empty", "missing"} {
		keys, err := apiKeysFromSecret(t.Context(), sm, id)
		if err == nil {
			t.Errorf("%s: keys %q, want an error", id, keys)
			continue
		}
		if !strings.Contains(err.Error(), "-api-keys-secret") || strings.Contains(err.Error(), "nothing") {
			t.Errorf("%s: error %q: want one naming the flag and not the secret's content", id, err)
		}
	}
}
