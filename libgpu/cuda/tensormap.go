package cuda

import (
	"errors"
	"runtime"
	"unsafe"
)

var (
	pTensorMapEncodeTiled  = newProc(libDriver, "cuTensorMapEncodeTiled")
	pTensorMapEncodeIm2col = newProc(libDriver, "cuTensorMapEncodeIm2col")
)

// TensorMap is a CUtensorMap: the 128 opaque bytes that describe a tensor
// in global memory to the Tensor Memory Accelerator (TMA, compute
// capability 9.0 and up), made by EncodeTiled or EncodeIm2col and passed
// to a kernel by value (a __grid_constant__ parameter, 64-byte aligned
// there: kernels/tma.cuh's gpukit_tmap). CUDA driver API, "Tensor Map
// Object Management".
type TensorMap [16]uint64

// The tensor map fields EncodeTiled and EncodeIm2col take
// (CUtensorMapDataType, CUtensorMapSwizzle, ...: cuda.h's values).
const (
	TensorMapBF16       = 9 // CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
	TensorMapSwizzle128 = 3 // CU_TENSOR_MAP_SWIZZLE_128B: 16-byte chunk c of row r at chunk c ^ (r mod 8)
	tensorMapL2_128     = 2 // CU_TENSOR_MAP_L2_PROMOTION_L2_128B
)

// EncodeTiled describes a rank-r tensor at addr (16-byte aligned) for
// tiled TMA copies (cp.async.bulk.tensor ... .tile) of boxes of box
// elements (dims[0] innermost, contiguous; each ≤ 256), zeros read outside
// the tensor: dims (r entries), strides the byte strides of dims 1..r−1
// (r−1 entries, multiples of 16), dtype and swizzle as the constants
// above. cuTensorMapEncodeTiled; errors as the driver's (an invalid
// combination is CUDA_ERROR_INVALID_VALUE).
func EncodeTiled(m *TensorMap, dtype int, addr DevicePtr, dims, strides []uint64, box []uint32, swizzle int) error {
	r := len(dims)
	if r < 1 || r > 5 || len(strides) != r-1 || len(box) != r {
		return badArg("EncodeTiled: rank %d with %d strides and %d box sizes", r, len(strides), len(box))
	}
	elem := make([]uint32, r)
	for i := range elem {
		elem[i] = 1
	}
	var sp unsafe.Pointer // nil for rank 1
	if r > 1 {
		sp = unsafe.Pointer(&strides[0])
	}
	return encodeAligned(m, func(p unsafe.Pointer) error {
		return pTensorMapEncodeTiled.cu(uintptr(p), uintptr(dtype), uintptr(r), uintptr(addr),
			uintptr(unsafe.Pointer(&dims[0])), uintptr(sp), uintptr(unsafe.Pointer(&box[0])), uintptr(unsafe.Pointer(&elem[0])),
			0, uintptr(swizzle), tensorMapL2_128, 0)
	})
}

// EncodeIm2col describes an NHWC (rank 4: dims {C, W, H, N}) or NDHWC
// tensor at addr for TMA's im2col copies (cp.async.bulk.tensor ...
// .im2col): each copy gathers pixels pixels (≤ 256) of channels channels
// (≤ 256) from the positions a convolution's filter tap reads, walking the
// output positions W fastest with the traversal strides elem (r entries:
// 1, the convolution's strides, 1), within the bounding box lower..upper
// (r−2 entries each, W first: −pad, and pad − dilation·(k − 1)), zeros
// outside the tensor. cuTensorMapEncodeIm2col; strides and errors as
// EncodeTiled.
func EncodeIm2col(m *TensorMap, dtype int, addr DevicePtr, dims, strides []uint64, lower, upper []int32,
	channels, pixels uint32, elem []uint32, swizzle int) error {
	r := len(dims)
	if r < 3 || r > 5 || len(strides) != r-1 || len(lower) != r-2 || len(upper) != r-2 || len(elem) != r {
		return badArg("EncodeIm2col: rank %d with %d strides, corners of %d and %d, %d element strides",
			r, len(strides), len(lower), len(upper), len(elem))
	}
	return encodeAligned(m, func(p unsafe.Pointer) error {
		return pTensorMapEncodeIm2col.cu(uintptr(p), uintptr(dtype), uintptr(r), uintptr(addr),
			uintptr(unsafe.Pointer(&dims[0])), uintptr(unsafe.Pointer(&strides[0])),
			uintptr(unsafe.Pointer(&lower[0])), uintptr(unsafe.Pointer(&upper[0])), uintptr(channels), uintptr(pixels),
			uintptr(unsafe.Pointer(&elem[0])), 0, uintptr(swizzle), tensorMapL2_128, 0)
	})
}

// encodeAligned runs encode on a 64-byte-aligned TensorMap (the driver's
// requirement; a Go value is 8-byte aligned) and copies it into m. The
// buffer is pinned, which also puts it on the heap: a buffer on the
// goroutine's stack moves when the stack grows, and the stack may grow
// between taking its address and the C call — on a GPU machine
// (2026-11-29) the driver then wrote the map into the old stack, the copy
// read zeros and the kernel's TMA copies faulted with
// CUDA_ERROR_ILLEGAL_INSTRUCTION (issue 24). encode converts p to uintptr
// only in the argument list of its //go:uintptrescapes call.
func encodeAligned(m *TensorMap, encode func(p unsafe.Pointer) error) error {
	buf := new([TensorMapBytes + 64]byte)
	var pin runtime.Pinner
	pin.Pin(buf)
	defer pin.Unpin()
	off := (64 - uintptr(unsafe.Pointer(&buf[0]))%64) % 64 // pinned
	if err := encode(unsafe.Pointer(&buf[off])); err != nil {
		return err
	}
	*m = *(*TensorMap)(unsafe.Pointer(&buf[off]))
	if *m == (TensorMap{}) {
		return errors.New("cuda: cuTensorMapEncode reported success but left the tensor map zero")
	}
	return nil
}

// TensorMapBytes is the size of a TensorMap.
const TensorMapBytes = 128
