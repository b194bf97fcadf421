module gpukit/bench

go 1.26.8

require gpukit/libgpu v0.0.0

require (
	github.com/ebitengine/purego v0.11.3 // indirect
	golang.org/x/sys v0.49.0 // indirect
	gonum.org/v1/gonum v0.17.0 // indirect
)

replace gpukit/libgpu => ../libgpu
