// Package ckpt owns checkpoints: the safetensors file format (read, write,
// validate) and the atomic save of named tensors with string metadata.
//
// Format (https://github.com/huggingface/safetensors, README "Format"):
// an 8-byte little-endian unsigned header length N; N bytes of UTF-8 JSON
// {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...,
// "__metadata__": {"key": "value"}}, padded with spaces to a multiple of 8;
// then the byte buffer, in which each tensor occupies [begin, end) (offsets
// relative to the start of the buffer) as raw little-endian row-major data.
// Writers here sort tensors by name and lay them out contiguously in that
// order; readers accept any order but require the ranges to tile the buffer
// exactly (no gap, no overlap), as the reference implementation does.
package ckpt
