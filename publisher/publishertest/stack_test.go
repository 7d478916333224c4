package publishertest

import (
	"testing"

	"github.com/vramq/vramq/gpu"
	"github.com/vramq/vramq/internal/testenv/fakeoai"
	"github.com/vramq/vramq/localstack"
	"github.com/vramq/vramq/model/backend"
)

// The subscriber RunSubscriber starts keeps a reserve by its backend's kind,
// as cmd/subscriber chooses its default: a model in this process keeps 1 MiB
// of its device for the framework's allocations, whether the device is its
// own (backend.InProcess.Device) or Config.Device; a model server, whose
// memory is its KV cache in tokens, keeps none (1, the least Config takes).
// Before, the reserve followed whether a Config.Device was given, and a
// model that owns its device got a model server's.
func TestSubscriberReserveFollowsTheBackendsKind(t *testing.T) {
	model, dev := RefModel(t)
	srv := fakeoai.New(fakeoai.Config{})
	defer srv.Close()
	for _, tc := range []struct {
		name string
		b    backend.Backend
		dev  gpu.Device
		want int64
	}{
		{"in-process model on its own device", backend.InProcess{Model: model, Device: dev}, nil, 1 << 20},
		{"in-process model on Config.Device", backend.InProcess{Model: model}, dev, 1 << 20},
		{"model server", ServerModel(t, srv), nil, 1},
	} {
		if got := subscriberConfig(nil, localstack.URLs{}, nil, tc.b, tc.dev, nil).VRAMReserve; got != tc.want {
			t.Errorf("%s: reserve %d; want %d", tc.name, got, tc.want)
		}
	}
}
