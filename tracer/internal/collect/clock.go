package collect

import "golang.org/x/sys/unix"

// monoNow is CLOCK_MONOTONIC in ns, the clock of every traced process.
func monoNow() int64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return ts.Nano()
}
