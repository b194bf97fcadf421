package ops

// SetAttentionWGMMA sets which head dimensions take the sm_90a wgmma
// attention forward (0 none, 1 D = 128, 2 D = 64 and 128) and returns a
// func that restores the previous setting. Read at every call.
func SetAttentionWGMMA(mode int) (restore func()) {
	old := attnWGMode
	attnWGMode = mode
	return func() { attnWGMode = old }
}

// AttentionHopper reports whether e runs attention's wgmma kernels (a CUDA
// engine on an sm_90a device whose attention.cu has its wgmma code).
func AttentionHopper(e *Engine) bool { return e.c != nil && e.c.attnHopper() }
