package app

import (
	"gpukit/libgpu/device"
	"gpukit/libgpu/pool"
)

// dialPool connects to a gpupool daemon; its client allocates named buffers.
func dialPool(sock string) (device.Allocator, func(), error) {
	c, err := pool.Dial(sock)
	if err != nil {
		return nil, nil, err
	}
	return c, func() { c.Close() }, nil
}
