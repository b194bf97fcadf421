package cuda

import (
	"errors"
	"testing"
)

// TestTensorMapEncodeRefusesMismatchedRanks: the encoders check that
// their slices agree with the rank before the driver is reached (so this
// holds on a machine without one), naming the lengths.
func TestTensorMapEncodeRefusesMismatchedRanks(t *testing.T) {
	var m TensorMap
	for _, c := range []struct {
		what string
		err  error
	}{
		{"tiled: two strides for rank 2", EncodeTiled(&m, TensorMapBF16, 0, []uint64{64, 8}, []uint64{128, 1024}, []uint32{64, 8}, TensorMapSwizzle128)},
		{"tiled: one box size for rank 2", EncodeTiled(&m, TensorMapBF16, 0, []uint64{64, 8}, []uint64{128}, []uint32{64}, TensorMapSwizzle128)},
		{"tiled: rank 0", EncodeTiled(&m, TensorMapBF16, 0, nil, nil, nil, TensorMapSwizzle128)},
		{"im2col: rank 2", EncodeIm2col(&m, TensorMapBF16, 0, []uint64{64, 8}, []uint64{128}, nil, nil, 64, 128, []uint32{1, 1}, TensorMapSwizzle128)},
		{"im2col: one corner for rank 4", EncodeIm2col(&m, TensorMapBF16, 0, []uint64{64, 8, 8, 2}, []uint64{128, 1024, 8192},
			[]int32{-1}, []int32{-1, -1}, 64, 128, []uint32{1, 1, 1, 1}, TensorMapSwizzle128)},
		{"im2col: three element strides for rank 4", EncodeIm2col(&m, TensorMapBF16, 0, []uint64{64, 8, 8, 2}, []uint64{128, 1024, 8192},
			[]int32{-1, -1}, []int32{-1, -1}, 64, 128, []uint32{1, 1, 1}, TensorMapSwizzle128)},
	} {
		if !errors.Is(c.err, ErrBadArg) {
			t.Errorf("%s: %v, want ErrBadArg", c.what, c.err)
		}
	}
}
