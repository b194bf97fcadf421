// Package bench holds gpukit's side-by-side benchmarks: cmd/gpukit-bench runs
// each workload on a GPU machine and reference/*.py runs the same workload in
// PyTorch; run.sh alternates the two and writes results/<date>-<gpu>.json,
// from which BENCHMARKS.md is generated.
package bench
