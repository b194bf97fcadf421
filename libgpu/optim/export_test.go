package optim

import "gpukit/libgpu/ops"

// StepAsReplay runs o.Step as a replay of a graph captured at step
// captured would run: the device work Step queues when the host's mirror
// believes the step is captured (so that any host value that leaked into
// the captured work shows as a difference), then puts the host's count
// back for the caller's Replayed.
func StepAsReplay(o *Shampoo, e *ops.Engine, captured int) error {
	now := o.step.t
	o.step.t = captured - 1
	err := o.Step(e)
	o.step.t = now
	return err
}
