module gpukit/bench

go 1.26.8

require (
	golang.org/x/sys v0.49.0
	gpukit/libgpu v0.0.0
)

require (
	github.com/ebitengine/purego v0.11.3 // indirect
	github.com/vmihailenco/msgpack/v5 v5.4.1 // indirect
	github.com/vmihailenco/tagparser/v2 v2.0.0 // indirect
	gonum.org/v1/gonum v0.17.0 // indirect
)

replace gpukit/libgpu => ../libgpu
