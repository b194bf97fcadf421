package cli

import (
	"fmt"
	"math/big"
	"strings"

	ucli "github.com/urfave/cli/v2"
)

// SizeSyntax is how a byte size is written, for usage strings and errors.
const SizeSyntax = "bytes, or a number with a unit: KiB, MiB, GiB, TiB (powers of 1024; K, M, G, T mean the same), KB, MB, GB, TB (powers of 1000)"

// sizeUnits maps a unit, lower-cased, to its bytes. A bare K, M, G or T is
// the IEC unit (as in GNU coreutils' dd, sort -S and truncate -s, and
// Docker's --memory): 1G is 2^30 bytes, 1GB is 10^9.
var sizeUnits = map[string]int64{
	"": 1, "b": 1,
	"k": 1 << 10, "kib": 1 << 10, "kb": 1e3,
	"m": 1 << 20, "mib": 1 << 20, "mb": 1e6,
	"g": 1 << 30, "gib": 1 << 30, "gb": 1e9,
	"t": 1 << 40, "tib": 1 << 40, "tb": 1e12,
}

// ParseSize reads a byte count: a non-negative number with an optional
// unit, any case, with or without a space between: 4096, 4096B, 64KiB (=
// 64K = 65536), 64KB (= 64000), 1.5GiB. The result must be a whole number
// of bytes that fits in an int64. Errors do not wrap ErrUsage; SizeValue
// adds the flag's name and makes them usage errors.
func ParseSize(s string) (int64, error) {
	t := strings.TrimSpace(s)
	i := 0
	for i < len(t) && (t[i] >= '0' && t[i] <= '9' || t[i] == '.') {
		i++
	}
	num, unit := t[:i], strings.ToLower(strings.TrimSpace(t[i:]))
	mul, ok := sizeUnits[unit]
	if !ok || num == "" || num == "." || strings.Count(num, ".") > 1 {
		return 0, fmt.Errorf("bad size %q: want %s", s, SizeSyntax)
	}
	r, ok := new(big.Rat).SetString(num)
	if !ok {
		return 0, fmt.Errorf("bad size %q: want %s", s, SizeSyntax)
	}
	r.Mul(r, new(big.Rat).SetInt64(mul))
	if !r.IsInt() {
		return 0, fmt.Errorf("bad size %q: not a whole number of bytes", s)
	}
	if !r.Num().IsInt64() {
		return 0, fmt.Errorf("bad size %q: too large", s)
	}
	return r.Num().Int64(), nil
}

// FormatSize writes n bytes the way ParseSize reads them back exactly: in
// the largest IEC or SI unit that divides n (the shorter number wins, IEC
// on a tie), else in bytes: 65536 → "64KiB", 1000000000 → "1GB", 1500 →
// "1500B", 0 → "0B".
func FormatSize(n int64) string {
	best := fmt.Sprintf("%dB", n)
	bestNum := n
	if n == 0 {
		return best
	}
	for _, u := range []struct {
		name string
		mul  int64
	}{
		{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10},
		{"TB", 1e12}, {"GB", 1e9}, {"MB", 1e6}, {"KB", 1e3},
	} {
		if n%u.mul == 0 && abs(n/u.mul) < abs(bestNum) {
			best, bestNum = fmt.Sprintf("%d%s", n/u.mul, u.name), n/u.mul
		}
	}
	return best
}

func abs(n int64) int64 {
	if n < 0 {
		return -n
	}
	return n
}

// SizeFlag is a flag holding a byte size as the user spelled it (the help
// shows the default as written, e.g. 64MiB); read it with SizeValue.
func SizeFlag(name, value, usage string) *ucli.StringFlag {
	return &ucli.StringFlag{Name: name, Value: value, Usage: usage + " (a size: 4096, 64KiB = 64K, 64KB = 64000)"}
}

// SizeValue reads the size flag name from c: a usage error naming the
// flag for bad input. An empty value reads as 0.
func SizeValue(c *ucli.Context, name string) (int64, error) {
	s := c.String(name)
	if strings.TrimSpace(s) == "" {
		return 0, nil
	}
	n, err := ParseSize(s)
	if err != nil {
		return 0, Usagef("--%s: %v", name, err)
	}
	return n, nil
}
