package cuda

import (
	"testing"
	"unsafe"
)

// graphNodeParams and conditionalNodeParams must match cuda.h's
// CUgraphNodeParams (256 bytes, the union at 16) and
// CUDA_CONDITIONAL_NODE_PARAMS (handle, type, size, phGraph_out, ctx).
func TestGraphNodeParamsLayout(t *testing.T) {
	var p graphNodeParams
	var e GraphEdgeData
	for _, c := range []struct {
		what      string
		got, want uintptr
	}{
		{"sizeof(CUgraphNodeParams)", unsafe.Sizeof(p), 256},
		{"offsetof(CUgraphNodeParams, conditional)", unsafe.Offsetof(p.cond), 16},
		{"offsetof(CUgraphNodeParams, reserved2)", unsafe.Offsetof(p.reserved2), 248},
		{"sizeof(CUDA_CONDITIONAL_NODE_PARAMS)", unsafe.Sizeof(p.cond), 32},
		{"offsetof(CUDA_CONDITIONAL_NODE_PARAMS, type)", unsafe.Offsetof(p.cond.typ), 8},
		{"offsetof(CUDA_CONDITIONAL_NODE_PARAMS, size)", unsafe.Offsetof(p.cond.size), 12},
		{"offsetof(CUDA_CONDITIONAL_NODE_PARAMS, phGraph_out)", unsafe.Offsetof(p.cond.graphs), 16},
		{"offsetof(CUDA_CONDITIONAL_NODE_PARAMS, ctx)", unsafe.Offsetof(p.cond.ctx), 24},
		{"sizeof(CUgraphEdgeData)", unsafe.Sizeof(e), 8},
	} {
		if c.got != c.want {
			t.Errorf("%s = %d, want %d", c.what, c.got, c.want)
		}
	}
}
