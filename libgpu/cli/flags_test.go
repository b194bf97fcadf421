package cli

import (
	"bytes"
	"math"
	"testing"
	"time"

	ucli "github.com/urfave/cli/v2"
)

// flagApp has one command with a flag of each numeric kind: plain ones
// (Setup's shared rules) and ranged ones (IntAtLeast, FloatWhere). Its
// action records that it ran.
func flagApp(stdout, stderr *bytes.Buffer, ran *bool) *ucli.App {
	return &ucli.App{
		Name: "tool", Writer: stdout, ErrWriter: stderr,
		Flags: []ucli.Flag{&ucli.DurationFlag{Name: "root-wait"}},
		Commands: []*ucli.Command{{
			Name: "go",
			Flags: []ucli.Flag{
				&ucli.IntFlag{Name: "top", Value: 10},
				&ucli.Int64Flag{Name: "big"},
				&ucli.Float64Flag{Name: "x"},
				&ucli.DurationFlag{Name: "wait", Value: time.Second},
				IntAtLeast(&ucli.IntFlag{Name: "jobs", Aliases: []string{"j"}, Value: 4, EnvVars: []string{"TOOL_JOBS"}}, 1),
				FloatWhere(&ucli.Float64Flag{Name: "p", Value: 0.5}, "want 0 ≤ p < 1", func(v float64) bool { return v >= 0 && v < 1 }),
				&ucli.IntFlag{Name: "shift", Action: func(*ucli.Context, int) error { return nil }}, // its own rule: any integer
			},
			Action: func(*ucli.Context) error { *ran = true; return nil },
		}},
	}
}

func TestFlagRules(t *testing.T) {
	for _, c := range []struct {
		args []string
		env  string
		say  string // "" : accepted
	}{
		{args: []string{"go"}}, // every default passes
		{args: []string{"go", "--top", "0", "--big", "0", "--x", "-2.5", "--wait", "0s", "-j", "1", "--p", "0", "--shift", "-7"}},
		{args: []string{"go", "--top", "-3"}, say: "tool: usage: --top -3: want an integer ≥ 0 (see tool go --help)"},
		{args: []string{"go", "--big", "-1"}, say: "tool: usage: --big -1: want an integer ≥ 0 (see tool go --help)"},
		{args: []string{"go", "-j", "-3"}, say: "tool: usage: --jobs -3: want an integer ≥ 1 (see tool go --help)"},
		{args: []string{"go", "-j", "0"}, say: "tool: usage: --jobs 0: want an integer ≥ 1 (see tool go --help)"},
		{args: []string{"go"}, env: "0", say: "tool: usage: --jobs 0: want an integer ≥ 1 (see tool go --help)"},
		{args: []string{"go", "--x", "NaN"}, say: "tool: usage: --x NaN: want a finite number (see tool go --help)"},
		{args: []string{"go", "--x", "-Inf"}, say: "tool: usage: --x -Inf: want a finite number (see tool go --help)"},
		{args: []string{"go", "--p", "1"}, say: "tool: usage: --p 1: want 0 ≤ p < 1 (see tool go --help)"},
		{args: []string{"go", "--p", "+Inf"}, say: "tool: usage: --p +Inf: want 0 ≤ p < 1 (see tool go --help)"},
		{args: []string{"go", "--wait", "-5s"}, say: "tool: usage: --wait -5s: want a duration ≥ 0 (e.g. 30s) (see tool go --help)"},
		{args: []string{"--root-wait", "-1m", "go"}, say: "tool: usage: --root-wait -1m0s: want a duration ≥ 0 (e.g. 30s) (see tool --help)"},
	} {
		t.Setenv("TOOL_JOBS", c.env)
		var o, e bytes.Buffer
		ran := false
		code := Main(flagApp(&o, &e, &ran), append([]string{"tool"}, c.args...))
		if c.say == "" {
			if code != 0 || !ran || e.Len() > 0 {
				t.Errorf("%q: exit %d, ran %v, stderr %q; want it accepted", c.args, code, ran, e.String())
			}
			continue
		}
		if code != ExitUsage || ran || o.Len() > 0 || e.String() != c.say+"\n" {
			t.Errorf("%q (TOOL_JOBS=%q): exit %d, ran %v, stdout %q, stderr %q; want exit 2 before the command, %q",
				c.args, c.env, code, ran, o.String(), e.String(), c.say)
		}
	}
}

func TestCheckMemory(t *testing.T) {
	got, ok := memAvailable("MemTotal:       16314248 kB\nMemFree:  100 kB\nMemAvailable:   12000000 kB\nBuffers: 1 kB\n")
	if !ok || got != 12000000<<10 {
		t.Fatalf("memAvailable = %d, %v", got, ok)
	}
	for _, bad := range []string{"", "MemAvailable: lots kB\n", "MemAvailable: 12 MB\n"} {
		if _, ok := memAvailable(bad); ok {
			t.Errorf("memAvailable(%q) read a figure", bad)
		}
	}
	old := memAvailableFn
	defer func() { memAvailableFn = old }()
	memAvailableFn = func() (int64, bool) { return 12 << 30, true }
	if err := CheckMemory("--n 100", 1<<20); err != nil {
		t.Fatal(err)
	}
	err := CheckMemory("--n 100000000", 298<<30+5)
	if ExitCode(err) != ExitUsage || err.Error() != "usage: --n 100000000 needs about 298GiB of memory, more than the 12GiB available now; lower it" {
		t.Fatalf("CheckMemory: %v (exit %d)", err, ExitCode(err))
	}
	memAvailableFn = func() (int64, bool) { return 0, false }
	if err := CheckMemory("--n 1", math.MaxInt64); err != nil {
		t.Fatalf("unknown memory refused: %v", err)
	}
	if n, ok := MemAvailable(); ok && n <= 0 {
		t.Fatalf("MemAvailable = %d", n)
	}
}
