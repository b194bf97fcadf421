package cli

import (
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"time"

	ucli "github.com/urfave/cli/v2"
)

// Numeric flags are checked when they are parsed, before the command
// runs: urfave/cli calls a set flag's Action first, and a refused value is
// a usage error (exit 2) naming the flag, the value and what it wants.
//
// Setup gives every numeric flag without an Action of its own the rules
// no gpukit tool has an exception to: integers and durations are not
// negative, floats are finite. Narrower ranges are stated per flag with
// IntAtLeast and FloatWhere.

// IntAtLeast makes f refuse values below lo and returns f.
func IntAtLeast(f *ucli.IntFlag, lo int) *ucli.IntFlag {
	name := f.Name
	f.Action = func(c *ucli.Context, v int) error {
		if v < lo {
			return flagUsage(c, name, strconv.Itoa(v), fmt.Sprintf("want an integer ≥ %d", lo))
		}
		return nil
	}
	return f
}

// FloatWhere makes f refuse a value that is not finite or that ok
// rejects, saying want ("want 0 ≤ p < 1"), and returns f.
func FloatWhere(f *ucli.Float64Flag, want string, ok func(float64) bool) *ucli.Float64Flag {
	name := f.Name
	f.Action = func(c *ucli.Context, v float64) error {
		if math.IsNaN(v) || math.IsInf(v, 0) || !ok(v) {
			return flagUsage(c, name, strconv.FormatFloat(v, 'g', -1, 64), want)
		}
		return nil
	}
	return f
}

// flagUsage is the usage error of a refused flag value.
func flagUsage(c *ucli.Context, name, value, want string) error {
	return Usagef("--%s %s: %s (see %s --help)", name, value, want, helpName(c))
}

// checkFlags gives the flags without an Action of their own the rules
// every tool shares (see above).
func checkFlags(flags []ucli.Flag) {
	for _, f := range flags {
		switch f := f.(type) {
		case *ucli.IntFlag:
			if f.Action == nil {
				IntAtLeast(f, 0)
			}
		case *ucli.Int64Flag:
			if f.Action == nil {
				name := f.Name
				f.Action = func(c *ucli.Context, v int64) error {
					if v < 0 {
						return flagUsage(c, name, strconv.FormatInt(v, 10), "want an integer ≥ 0")
					}
					return nil
				}
			}
		case *ucli.Float64Flag:
			if f.Action == nil {
				FloatWhere(f, "want a finite number", func(float64) bool { return true })
			}
		case *ucli.DurationFlag:
			if f.Action == nil {
				name := f.Name
				f.Action = func(c *ucli.Context, v time.Duration) error {
					if v < 0 {
						return flagUsage(c, name, v.String(), "want a duration ≥ 0 (e.g. 30s)")
					}
					return nil
				}
			}
		}
	}
}

// MemAvailable is the memory the kernel says can be allocated without
// swapping (MemAvailable of /proc/meminfo), in bytes; ok is false where
// it cannot be read.
func MemAvailable() (n int64, ok bool) {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, false
	}
	return memAvailable(string(b))
}

func memAvailable(meminfo string) (int64, bool) {
	for _, l := range strings.Split(meminfo, "\n") {
		if rest, ok := strings.CutPrefix(l, "MemAvailable:"); ok {
			f := strings.Fields(rest)
			if len(f) != 2 || f[1] != "kB" {
				return 0, false
			}
			kb, err := strconv.ParseInt(f[0], 10, 64)
			if err != nil || kb < 0 {
				return 0, false
			}
			return kb << 10, true
		}
	}
	return 0, false
}

// memAvailableFn is MemAvailable; tests replace it.
var memAvailableFn = MemAvailable

// CheckMemory refuses, as a usage error, a request whose host memory need
// (bytes, an estimate) exceeds the memory available now: what names the
// flags that decide it ("--n 100000000"), so the user learns what to lower
// instead of seeing the process killed for lack of memory later. Where the
// available memory cannot be read it accepts.
func CheckMemory(what string, need int64) error {
	have, ok := memAvailableFn()
	if !ok || need <= have {
		return nil
	}
	return Usagef("%s needs about %s of memory, more than the %s available now; lower it", what, FormatSize(roundSize(need)), FormatSize(roundSize(have)))
}

// roundSize rounds n to a whole MiB (GiB from 10 GiB on), so FormatSize
// prints a short figure.
func roundSize(n int64) int64 {
	u := int64(1 << 20)
	if n >= 10<<30 {
		u = 1 << 30
	}
	return (n + u/2) / u * u
}
