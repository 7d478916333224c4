package backend

import (
	"strconv"

	"github.com/vramq/vramq/gpu"
	"github.com/vramq/vramq/internal/bytesize"
)

// Memory is what bounds a backend's admission as a whole, in the
// backend's own Unit: the device bytes of a model in this process, or the
// KV-cache tokens of a model server. Backend.Cost is in the same unit. The
// subscriber's budget is read from it: free plus what this process's work
// holds, less the reserve. Implementations are safe for concurrent use.
type Memory interface {
	// Name says what holds the memory, e.g. "sim", "NVIDIA H100 80GB HBM3
	// (0)" or "model-server host:8000"; the subscriber's state file is kept
	// per name.
	Name() string
	// Unit is what the memory counts, and Backend.Cost charges.
	Unit() Unit
	// Simulated is true when the reading is vramq's own account rather
	// than read from the hardware or the server.
	Simulated() bool
	// Read reads it now.
	Read() (Reading, error)
}

// Unit is what a Memory counts. A device's bytes and a model server's KV
// tokens are two resources, not one at a conversion rate: a server
// allocates its cache in blocks of tokens (vLLM's
// vllm:cache_config_info names how many, and of how many tokens), so the
// tokens are what it can be asked for and what it reports, whatever a
// token's bytes.
type Unit int

const (
	// DeviceBytes is a device's memory, in bytes: a model in this
	// process.
	DeviceBytes Unit = iota
	// KVTokens is a model server's KV cache, in tokens.
	KVTokens
)

// String is the unit's name in metrics: bytes or kv_tokens.
func (u Unit) String() string {
	if u == KVTokens {
		return "kv_tokens"
	}
	return "bytes"
}

// Format is n of u as logs and errors show it: "1.5 GiB" for bytes, "32768
// KV tokens" for tokens.
func (u Unit) Format(n int64) string {
	if u == KVTokens {
		return strconv.FormatInt(n, 10) + " KV tokens"
	}
	return bytesize.Format(n)
}

// Reading is a snapshot of a Memory, in its unit.
type Reading struct {
	Total, Free, Used int64
	// Process is what this process holds, when the memory can tell (NVML
	// can, per process; a model server's KV cache, the share of vramq's
	// requests); 0 when unknown.
	Process int64
}

// MemoryOwner is a Backend that owns its Memory. A Backend that is not
// one, or whose Memory is nil, is bounded by the subscriber's
// Config.Device.
type MemoryOwner interface {
	Memory() Memory
}

// DeviceMemory is a device's memory, in bytes, as a Memory.
func DeviceMemory(d gpu.Device) Memory { return deviceMemory{d} }

type deviceMemory struct{ gpu.Device }

func (deviceMemory) Unit() Unit { return DeviceBytes }

func (d deviceMemory) Read() (Reading, error) {
	m, err := d.MemInfo()
	return Reading(m), err
}
