package driver

import (
	"strconv"
	"strings"

	kit "gpukit/libgpu/cli"
)

// ParseInts reads a flag's list of positive integers separated by commas
// ("784,256,10"); a bad one is a usage error naming the flag.
func ParseInts(flag, s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		v, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || v < 1 {
			return nil, kit.Usagef("--%s %q: want positive integers separated by commas", flag, s)
		}
		out = append(out, v)
	}
	return out, nil
}

// JoinInts writes v as ParseInts reads it.
func JoinInts(v []int) string {
	s := make([]string, len(v))
	for i, x := range v {
		s[i] = strconv.Itoa(x)
	}
	return strings.Join(s, ",")
}
