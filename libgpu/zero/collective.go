package zero

import (
	"errors"

	"gpukit/libgpu/nccl"
	"gpukit/libgpu/ops"
	"gpukit/libgpu/tensor"
)

// ErrConfig: a sharded optimizer's communicator, layout or parameters do
// not fit together.
var ErrConfig = errors.New("zero: invalid configuration")

// Collective is what the sharded optimizers need of a communicator: a
// *nccl.Comm, or the in-process stand-in of libgpu/nccl/nccltest.
type Collective interface {
	nccl.ShardCollective
	Broadcast(e *ops.Engine, dst, src *tensor.Tensor, root int) error
	Group(e *ops.Engine, fn func() error) error
}

var _ Collective = (*nccl.Comm)(nil)
