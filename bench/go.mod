module gpukit/bench

go 1.26.8

require gpukit/libgpu v0.0.0

replace gpukit/libgpu => ../libgpu
