package cuda

// HideLibrariesForTest makes every library unloadable in this process: the
// sonames are replaced by names that do not exist and only GPUKIT_CUDA_PATH
// is searched. It must run before the first CUDA call (TestMain of a child
// process).
func HideLibrariesForTest() {
	for _, l := range []*library{libDriver, libNVRTC, libBLASLt, libSolver} {
		l.names = []string{"libgpukit-hidden-" + l.names[0]}
	}
	searchDirs = func() []string { return nil }
}
