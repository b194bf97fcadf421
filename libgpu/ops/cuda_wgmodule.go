package ops

import (
	"sync"

	"gpukit/libgpu/kernels/launch"
)

// wgModule is one kernel family's cached answer to whether its kernel
// file was compiled with its wgmma code (sm_90a only): exec.StateOf keys
// it per engine by the family's own type embedding it, so a captured graph
// takes the path the eager run took.
type wgModule struct {
	once sync.Once
	ok   bool
}

// has reports, once, whether c's compiler targets sm_90a and the module of
// marker's file builds without marker, the kernel such a file defines when
// its sm_90a guard (__CUDA_ARCH_FEAT_SM90_ALL) is off. A module that does
// not build reads as without wgmma: the family's other kernels run (and
// report the error if they share the file).
func (m *wgModule) has(c *cudaImpl, marker launch.Kernel) bool {
	m.once.Do(func() {
		kc, err := c.Compiler()
		if err != nil || kc.Arch() != "sm_90a" {
			return
		}
		unavailable, err := kc.Has(marker.File, marker.Name)
		m.ok = err == nil && !unavailable
	})
	return m.ok
}
