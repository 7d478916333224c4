package tenant

import (
	"fmt"
	"strings"
	"testing"
)

// TestValid: SQS's MessageGroupId rule, 1 to 128 characters of ASCII
// letters, digits and the punctuation !"#$%&'()*+,-./:;<=>?@[\]^_`{|}~.
func TestValid(t *testing.T) {
	punct := "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"
	for _, s := range []string{"a", "acme", "Tenant-42", punct, strings.Repeat("x", 128), "team/ml:prod"} {
		if !Valid(s) {
			t.Errorf("Valid(%q) = false", s)
		}
	}
	for _, s := range []string{"", strings.Repeat("x", 129), "a b", "a\tb", "a\nb", "é", "a\x00", "a\x7f", None, Other} {
		if Valid(s) {
			t.Errorf("Valid(%q) = true", s)
		}
	}
}

func TestOfKey(t *testing.T) {
	a, b := OfKey("secret-one"), OfKey("secret-two")
	if a == b || !Valid(a) || len(a) != len("key-")+12 || !strings.HasPrefix(a, "key-") {
		t.Errorf("OfKey: %q, %q", a, b)
	}
	if a != OfKey("secret-one") {
		t.Error("OfKey is not stable")
	}
	if strings.Contains(a, "secret") {
		t.Errorf("OfKey(%q) = %q shows the key", "secret-one", a)
	}
}

// TestLabelsBounded: past the limit, new tenants share Other; the first
// ones and the fixed ones keep their own; invalid names are None.
func TestLabelsBounded(t *testing.T) {
	l := NewLabels(3, "alice", "bad name")
	for i := range 3 {
		if got := l.Label(fmt.Sprint("t", i)); got != fmt.Sprint("t", i) {
			t.Errorf("tenant %d: %q", i, got)
		}
	}
	for i := 3; i < 100; i++ {
		if got := l.Label(fmt.Sprint("t", i)); got != Other {
			t.Fatalf("tenant %d past the limit: %q", i, got)
		}
	}
	if got := l.Label("t1"); got != "t1" {
		t.Errorf("an early tenant lost its label: %q", got)
	}
	if got := l.Label("alice"); got != "alice" {
		t.Errorf("a fixed tenant: %q", got)
	}
	for _, s := range []string{"", "bad name", "x\n"} {
		if got := l.Label(s); got != None {
			t.Errorf("Label(%q) = %q, want %q", s, got, None)
		}
	}
}
