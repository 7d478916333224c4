//go:build cuda

package calibrate

import "github.com/vramq/vramq/model/refembed"

var _ Meter = (*refembed.CUDAEmbedder)(nil)
