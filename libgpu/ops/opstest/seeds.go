package opstest

import (
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"testing"

	"gpukit/libgpu/device"
	"gpukit/libgpu/ops"
)

// seed is a run's seed: $GPUKIT_OPSTEST_SEED when set, else a fresh draw;
// it is logged.
func seed(t *testing.T) uint64 {
	t.Helper()
	return envSeed(t, "GPUKIT_OPSTEST_SEED", "opstest seed %d (set GPUKIT_OPSTEST_SEED to repeat)")
}

// envSeed is $env parsed when set, else a fresh draw, logged with format.
func envSeed(t testing.TB, env, format string) uint64 {
	t.Helper()
	s := rand.Uint64()
	if v := os.Getenv(env); v != "" {
		var err error
		if s, err = strconv.ParseUint(v, 10, 64); err != nil {
			t.Fatalf("%s=%q: %v", env, v, err)
		}
	}
	t.Logf(format, s)
	return s
}

// Seeds is how many fresh seeds CheckSeeds runs: $GPUKIT_OPSTEST_SEEDS when
// it is a positive integer, else n.
func Seeds(n int) int {
	if v, err := strconv.Atoi(os.Getenv("GPUKIT_OPSTEST_SEEDS")); err == nil && v > 0 {
		return v
	}
	return n
}

// CheckSeeds runs CheckImpl (at tolerance tol) and CheckFamilies on an
// engine for dev with opts for n fresh seeds, each a subtest
// "seed=<seed>" (GPUKIT_OPSTEST_SEED=<seed> repeats one), so a
// comparison that fails by chance — a tolerance that does not follow
// the size of the terms summed — shows in CI rather than one GPU run in
// a few hundred.
func CheckSeeds(t *testing.T, n int, dev device.Device, opts ops.Options, tol float64) {
	t.Helper()
	if os.Getenv("GPUKIT_OPSTEST_SEED") != "" {
		n = 1 // repeat that seed alone
	}
	for i := 0; i < n; i++ {
		s := seed(t)
		t.Run(fmt.Sprintf("seed=%d", s), func(t *testing.T) {
			t.Run("Impl", func(t *testing.T) { checkImpl(t, dev, opts, tol, s) })
			t.Run("Families", func(t *testing.T) { checkFamilies(t, dev, opts, nil, s) })
		})
	}
}

// TestSeed is a test's seed for its random inputs: $GPUKIT_TEST_SEED when
// set (to repeat a run whose log printed it), else a fresh draw. It is
// logged either way.
func TestSeed(t testing.TB) uint64 {
	t.Helper()
	return envSeed(t, "GPUKIT_TEST_SEED", "seed %d (GPUKIT_TEST_SEED repeats it)")
}
