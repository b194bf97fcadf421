package ops

// SetAttentionWGMMA sets which head dimensions take the sm_90a wgmma
// attention kernels and which wgmma forward runs (attnWGMode: 0 none, 1
// the default, 2 D = 64 and 128 on attn_fwd_wg, 3 D = 64 and 128 on
// attn_fwd_ws, dropping too, 4 as 3 persistent without dropout, 5 three
// consumers at D = 64, 6 as 5 persistent) and returns a func that
// restores the previous setting. Read at every call.
func SetAttentionWGMMA(mode int) (restore func()) {
	return setVar(&attnWGMode, mode)
}

// SetAttentionBwdWS sets which backward passes run warp-specialised
// (attnBwdWSMode: 0 neither, 1 the default, 2 both) from now on and
// returns a func that restores the previous setting.
func SetAttentionBwdWS(mode int) (restore func()) {
	return setVar(&attnBwdWSMode, mode)
}

// SetAttentionL2Budget sets the L2 bytes per group of heads in the
// attention kernels' launch order (0: no groups, the order before them).
func SetAttentionL2Budget(bytes int) (restore func()) {
	return setVar(&attnL2Budget, bytes)
}

// AttentionHopper reports whether e runs attention's wgmma kernels (a CUDA
// engine on an sm_90a device whose attention.cu has its wgmma code).
func AttentionHopper(e *Engine) bool { return e.c != nil && e.c.attnHopper() }

// SetAttentionWide lets the GPU forward take head dimension 256
// (attn_fwd_ws_d256; attnWide) and returns a func that restores the
// previous setting.
func SetAttentionWide(on bool) (restore func()) {
	return setVar(&attnWide, on)
}

// SetAttentionBwdWSDrop lets a backward with dropout take the
// warp-specialised kernels (attnBwdWSDrop) and returns a func that
// restores the previous setting.
func SetAttentionBwdWSDrop(on bool) (restore func()) {
	return setVar(&attnBwdWSDrop, on)
}
