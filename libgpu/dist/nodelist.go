package dist

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// ErrNodeList: a Slurm host list or tasks-per-node list does not parse.
var ErrNodeList = errors.New("dist: bad Slurm list")

// maxHosts bounds ExpandNodeList's output (a typo such as "n[1-99999999]"
// must not exhaust memory).
const maxHosts = 1 << 20

// ExpandNodeList expands a Slurm host list (SLURM_JOB_NODELIST's compressed
// form, as `scontrol show hostnames` does): hosts separated by commas, each
// with any number of bracketed ranges "prefix[a-b,c]suffix" whose numbers
// keep the zero padding of the range's first bound. Several bracket groups
// in one host multiply out, the last varying fastest:
//
//	"gpu[01-03,07],login1" → gpu01 gpu02 gpu03 gpu07 login1
//	"r[1-2]n[08-09]"       → r1n08 r1n09 r2n08 r2n09
//
// Errors (wrapping ErrNodeList): unbalanced or nested brackets, an empty
// host, a range whose bounds are not decimal or run backwards, more than
// 2²⁰ hosts.
func ExpandNodeList(list string) ([]string, error) {
	var out []string
	for _, host := range splitTop(list) {
		if host == "" {
			return nil, fmt.Errorf("%w: empty host in %q", ErrNodeList, list)
		}
		hs, err := expandHost(host, maxHosts-len(out))
		if err != nil {
			return nil, fmt.Errorf("%w: %q: %v", ErrNodeList, list, err)
		}
		out = append(out, hs...)
	}
	return out, nil
}

// FirstNode is the first host of a Slurm host list (the one that hosts
// rank 0 under Slurm's default block distribution).
func FirstNode(list string) (string, error) {
	hosts := splitTop(list)
	if len(hosts) == 0 || hosts[0] == "" {
		return "", fmt.Errorf("%w: no host in %q", ErrNodeList, list)
	}
	hs, err := expandHost(hosts[0], maxHosts)
	if err != nil {
		return "", fmt.Errorf("%w: %q: %v", ErrNodeList, list, err)
	}
	return hs[0], nil
}

// splitTop splits at the commas outside brackets.
func splitTop(s string) []string {
	var out []string
	depth, start := 0, 0
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '[':
			depth++
		case ']':
			depth--
		case ',':
			if depth == 0 {
				out = append(out, s[start:i])
				start = i + 1
			}
		}
	}
	return append(out, s[start:])
}

// expandHost expands one host with bracket groups into at most limit names.
func expandHost(h string, limit int) ([]string, error) {
	open := strings.IndexByte(h, '[')
	if open < 0 {
		if strings.ContainsRune(h, ']') {
			return nil, errors.New("']' without '['")
		}
		return []string{h}, nil
	}
	end := strings.IndexByte(h[open:], ']')
	if end < 0 {
		return nil, errors.New("'[' without ']'")
	}
	end += open
	inner := h[open+1 : end]
	if strings.ContainsRune(inner, '[') {
		return nil, errors.New("nested '['")
	}
	prefix := h[:open]
	if strings.ContainsRune(prefix, ']') {
		return nil, errors.New("']' without '['")
	}
	nums, err := expandRanges(inner, limit)
	if err != nil {
		return nil, err
	}
	rests, err := expandHost(h[end+1:], limit)
	if err != nil {
		return nil, err
	}
	if len(nums)*len(rests) > limit {
		return nil, fmt.Errorf("more than %d hosts", maxHosts)
	}
	out := make([]string, 0, len(nums)*len(rests))
	for _, n := range nums {
		for _, r := range rests {
			out = append(out, prefix+n+r)
		}
	}
	return out, nil
}

// expandRanges expands "01-03,07" into 01 02 03 07.
func expandRanges(s string, limit int) ([]string, error) {
	if s == "" {
		return nil, errors.New("empty brackets")
	}
	var out []string
	for _, part := range strings.Split(s, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		if !isRange {
			hi = lo
		}
		a, err := decimal(lo)
		if err != nil {
			return nil, err
		}
		b, err := decimal(hi)
		if err != nil {
			return nil, err
		}
		if b < a {
			return nil, fmt.Errorf("range %q runs backwards", part)
		}
		if b-a >= uint64(limit-len(out)) {
			return nil, fmt.Errorf("more than %d hosts", maxHosts)
		}
		for n := a; n <= b; n++ {
			d := strconv.FormatUint(n, 10)
			if pad := len(lo) - len(d); pad > 0 {
				d = strings.Repeat("0", pad) + d
			}
			out = append(out, d)
		}
	}
	return out, nil
}

func decimal(s string) (uint64, error) {
	if s == "" || strings.TrimLeft(s, "0123456789") != "" {
		return 0, fmt.Errorf("%q is not a decimal number", s)
	}
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%q: %v", s, err)
	}
	return n, nil
}

// TasksPerNode expands Slurm's tasks-per-node list (SLURM_TASKS_PER_NODE,
// SLURM_STEP_TASKS_PER_NODE): counts separated by commas, "c(xk)" standing
// for k nodes of c tasks: "2(x3),1" → [2 2 2 1]. Errors wrap ErrNodeList.
func TasksPerNode(s string) ([]int, error) {
	var out []int
	for _, part := range strings.Split(s, ",") {
		count, rep := part, "1"
		if i := strings.IndexByte(part, '('); i >= 0 {
			if !strings.HasPrefix(part[i:], "(x") || !strings.HasSuffix(part, ")") {
				return nil, fmt.Errorf("%w: tasks per node %q", ErrNodeList, s)
			}
			count, rep = part[:i], part[i+2:len(part)-1]
		}
		c, err1 := strconv.Atoi(count)
		k, err2 := strconv.Atoi(rep)
		if err1 != nil || err2 != nil || c < 0 || k < 1 || len(out)+k > maxHosts {
			return nil, fmt.Errorf("%w: tasks per node %q", ErrNodeList, s)
		}
		for range k {
			out = append(out, c)
		}
	}
	return out, nil
}
