// Package cudatest owns the test helpers shared by packages that need a GPU:
// RequireGPU skips a test on machines without one and fails it where a GPU
// is required (GPUKIT_REQUIRE_GPU=1, set on the GPU test machine), so a GPU
// test can never pass by skipping where it matters.
package cudatest
