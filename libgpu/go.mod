module gpukit/libgpu

go 1.26.8

require (
	github.com/ebitengine/purego v0.11.3
	github.com/vmihailenco/msgpack/v5 v5.4.1
	golang.org/x/sys v0.49.0
	gonum.org/v1/gonum v0.17.0
)

require github.com/vmihailenco/tagparser/v2 v2.0.0 // indirect
