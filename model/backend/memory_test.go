package backend

import (
	"testing"

	"github.com/vramq/vramq/gpu"
)

// A device's memory and a model server's KV cache are two units: each
// names and shows itself, and neither reads as the other.
func TestUnitsShowThemselves(t *testing.T) {
	for _, tc := range []struct {
		u          Unit
		n          int64
		name, show string
	}{
		{DeviceBytes, 3 << 20, "bytes", "3.0MiB"},
		{KVTokens, 32768, "kv_tokens", "32768 KV tokens"},
	} {
		if got := tc.u.String(); got != tc.name {
			t.Errorf("%d's name %q, want %q", tc.u, got, tc.name)
		}
		if got := tc.u.Format(tc.n); got != tc.show {
			t.Errorf("%v.Format(%d) = %q, want %q", tc.u, tc.n, got, tc.show)
		}
	}
	if u := DeviceMemory(gpu.NewSim(1 << 20)).Unit(); u != DeviceBytes {
		t.Errorf("a device's memory counts %v, want bytes", u)
	}
}
