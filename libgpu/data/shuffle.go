package data

import "math/rand/v2"

// EpochSeed derives the shuffle seed of epoch e from the run seed with
// SplitMix64's finaliser (Steele, Lea & Flood 2014), so every epoch has its
// own order and a resumed run recomputes the order of any epoch from (seed, e).
func EpochSeed(seed uint64, epoch int) uint64 {
	z := seed + 0x9e3779b97f4a7c15*uint64(epoch+1)
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// Order returns the permutation of [0, n) used in epoch e of a run with this
// seed: a Fisher–Yates shuffle (rand.Shuffle) driven by a PCG generator
// (math/rand/v2 NewPCG(EpochSeed(seed, e), seed)). The same (n, seed, e)
// always gives the same order.
func Order(n int, seed uint64, epoch int) []int {
	idx := make([]int, n)
	for i := range idx {
		idx[i] = i
	}
	r := rand.New(rand.NewPCG(EpochSeed(seed, epoch), seed))
	r.Shuffle(n, func(i, j int) { idx[i], idx[j] = idx[j], idx[i] })
	return idx
}

// Batches is the number of batches of size batch over n examples. In
// training the last partial batch is dropped (dropLast), so every step sees
// exactly batch examples and the model's static shapes hold; evaluation keeps
// it (pad it to the static batch and ignore the extra rows).
func Batches(n, batch int, dropLast bool) int {
	if batch <= 0 || n <= 0 {
		return 0
	}
	if dropLast {
		return n / batch
	}
	return (n + batch - 1) / batch
}

// Batch returns the indices of batch k (0-based) of an epoch's order: order[k·batch : min((k+1)·batch, len(order))].
func Batch(order []int, batch, k int) []int {
	lo := k * batch
	hi := min(lo+batch, len(order))
	if lo < 0 || lo >= hi {
		return nil
	}
	return order[lo:hi]
}
