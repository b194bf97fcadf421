package optim

import "gpukit/libgpu/ops"

// StepAsReplay runs o.Step (a Shampoo, SOAP or K-FAC) as a replay of a graph
// captured at step captured would run: the device work Step queues when
// the host's mirror believes the step is captured (so that any host value
// that leaked into the captured work shows as a difference), then puts
// the host's count back for the caller's Replayed.
func StepAsReplay(o Optimizer, e *ops.Engine, captured int) error {
	var r *rooted
	switch x := o.(type) {
	case *Shampoo:
		r = &x.rooted
	case *SOAP:
		r = &x.rooted
	case *KFAC:
		r = &x.rooted
	default:
		panic("StepAsReplay: not a rooted optimizer")
	}
	now := r.step.t
	r.step.t = captured - 1
	err := o.Step(e)
	r.step.t = now
	return err
}
