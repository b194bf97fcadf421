package exec

import "gpukit/libgpu/tensor"

// Host is the CPU backend: work runs when it is queued, in plain Go. It
// holds the scratch memory of composite ops (Scratch) and the op families'
// state (StateOf).
type Host struct {
	states
	tmp map[string][]uint64
}

// Scratch returns n bytes of memory for purpose name, 8-byte aligned,
// kept per name and grown when too small (contents undefined). A name
// holds one buffer at a time.
func (h *Host) Scratch(name string, n int64) []byte {
	if h.tmp == nil {
		h.tmp = map[string][]uint64{}
	}
	w := h.tmp[name]
	if int64(len(w))*8 < n {
		w = make([]uint64, (n+7)/8)
		h.tmp[name] = w
	}
	return tensor.AsBytes(w)[:n:n]
}
