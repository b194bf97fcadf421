package nn

// StepFLOPs is the number of floating-point operations of the GEMMs of one
// training step of m (multiply and add counted separately, 2·M·N·K per
// product): for every layer i mapping Widths[i] → Widths[i+1] over Batch
// rows, the forward product and the weight-gradient product, and the
// input-gradient product for every layer but the first (the input needs no
// gradient). Element-wise work (bias, activation, loss, optimizer) is left
// out, as in the usual model-FLOPs accounting (Chowdhery et al. 2022,
// "PaLM", appendix B).
func (m *MLP) StepFLOPs() float64 {
	return MLPStepFLOPs(m.cfg.Widths, m.cfg.Batch)
}

// MLPStepFLOPs is StepFLOPs for an MLP of these widths and batch size.
func MLPStepFLOPs(widths []int, batch int) float64 {
	f := 0.0
	for i := 0; i+1 < len(widths); i++ {
		mnk := 2 * float64(batch) * float64(widths[i]) * float64(widths[i+1])
		f += 2 * mnk // forward and weight gradient
		if i > 0 {
			f += mnk // input gradient
		}
	}
	return f
}
