package ipc

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// RaiseFDLimit raises this process's soft limit on open file descriptors
// (RLIMIT_NOFILE) to its hard limit, as a daemon should at start (each
// connection and each slab holds one), and returns the limit in force.
// Go's runtime does the same at start; a daemon calls it to be sure and to
// know the figure, which it reports (gpupool stats: fd_limit).
func RaiseFDLimit() (uint64, error) {
	var r unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &r); err != nil {
		return 0, fmt.Errorf("ipc: RLIMIT_NOFILE: %w", err)
	}
	if r.Cur < r.Max {
		r.Cur = r.Max
		if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &r); err != nil {
			return FDLimit(), fmt.Errorf("ipc: raise RLIMIT_NOFILE to %d: %w", r.Max, err)
		}
	}
	return r.Cur, nil
}

// FDLimit is this process's soft limit on open file descriptors (0 if it
// cannot be read).
func FDLimit() uint64 {
	var r unix.Rlimit
	if unix.Getrlimit(unix.RLIMIT_NOFILE, &r) != nil {
		return 0
	}
	return r.Cur
}
