module gpukit/bench

go 1.26.8

require gpukit/libgpu v0.0.0

require github.com/ebitengine/purego v0.11.3 // indirect

replace gpukit/libgpu => ../libgpu
