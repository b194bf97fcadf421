package exec

import "testing"

// residentBlocks follows the sm_90 limits.
func TestResidentBlocks(t *testing.T) {
	for _, c := range []struct{ regs, smem, threads, want int }{
		{32, 0, 256, 8},         // threads: 2048/256
		{64, 0, 256, 4},         // registers: 65536/(64·256)
		{100, 0, 256, 2},        // 104 regs per thread allocated
		{255, 0, 256, 1},        // at least one
		{16, 0, 32, 32},         // blocks
		{32, 100 << 10, 128, 2}, // shared memory: 228 KiB / 101 KiB
	} {
		if got := residentBlocks(c.regs, c.smem, c.threads); got != c.want {
			t.Errorf("residentBlocks(%d, %d, %d) = %d, want %d", c.regs, c.smem, c.threads, got, c.want)
		}
	}
}
