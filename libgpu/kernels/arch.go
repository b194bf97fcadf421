package kernels

import (
	"fmt"
	"regexp"
	"strconv"
)

// archSpecific lists the compute capabilities (major*10+minor) whose
// architecture-specific target ("sm_90a") Arch picks, so kernels may use
// features such as Hopper's wgmma and setmaxnreg. Source: CUDA C++
// Programming Guide, "Feature Availability" (arch-specific features, the "a"
// suffix); DESIGN.md uses sm_90a on Hopper. An "a" cubin runs only on that
// exact compute capability, which is why the arch is part of every cache key.
var archSpecific = map[int]bool{90: true, 100: true, 120: true}

// Arch is the NVRTC target for a device of compute capability major.minor:
// "sm_90a" for 9.0, "sm_100a" for 10.0, "sm_120a" for 12.0, else "sm_86" etc.
func Arch(major, minor int) string {
	cc := major*10 + minor
	s := fmt.Sprintf("sm_%d%d", major, minor)
	if archSpecific[cc] {
		s += "a"
	}
	return s
}

var archRE = regexp.MustCompile(`^(sm|compute)_([1-9][0-9]{1,2})([af]?)$`)

// ParseArch checks an architecture name ("sm_90a", "sm_80", "compute_90a")
// and returns its SM number (90) and suffix ("a", "f" or "").
func ParseArch(arch string) (sm int, suffix string, err error) {
	m := archRE.FindStringSubmatch(arch)
	if m == nil {
		return 0, "", fmt.Errorf("%w: %q (want sm_XY, sm_XYa or compute_XY[a], e.g. sm_90a)", ErrBadArch, arch)
	}
	sm, _ = strconv.Atoi(m[2])
	return sm, m[3], nil
}

// virtualArch maps "sm_90a" to "compute_90a" (what NVRTC needs to emit PTX).
func virtualArch(arch string) string {
	m := archRE.FindStringSubmatch(arch)
	if m == nil {
		return arch
	}
	return "compute_" + m[2] + m[3]
}

// realArch maps "compute_90a" to "sm_90a".
func realArch(arch string) string {
	m := archRE.FindStringSubmatch(arch)
	if m == nil {
		return arch
	}
	return "sm_" + m[2] + m[3]
}
