// Package tensor describes typed, strided views over device buffers: dtype,
// shape, strides and offset (both in elements), row-major by default.
// A Tensor owns no memory; its Buffer does.
package tensor
