package cli

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	ucli "github.com/urfave/cli/v2"
)

func TestParseSize(t *testing.T) {
	for _, c := range []struct {
		in   string
		want int64
	}{
		{"0", 0}, {"4096", 4096}, {"4096B", 4096}, {"4096 b", 4096},
		{"1K", 1 << 10}, {"1k", 1 << 10}, {"1KiB", 1 << 10}, {"1kib", 1 << 10}, {"1KB", 1000}, {"1kb", 1000},
		{"64M", 64 << 20}, {"64MiB", 64 << 20}, {"64MB", 64e6},
		{"1G", 1 << 30}, {"1GiB", 1 << 30}, {"1GB", 1e9}, {" 1 GB ", 1e9},
		{"2T", 2 << 40}, {"2TiB", 2 << 40}, {"2TB", 2e12},
		{"1.5GiB", 3 << 29}, {"0.5KB", 500}, {"1.25K", 1280}, {"8EB", 0}, // 8EB: not a unit
	} {
		got, err := ParseSize(c.in)
		if c.in == "8EB" {
			if err == nil {
				t.Errorf("ParseSize(%q) = %d, want an error", c.in, got)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", c.in, got, err, c.want)
		}
	}
	for _, bad := range []string{"", "lots", "-1", "1.5", "1..2K", ".", "K", "1 2K", "0.0003KB", "1e3", "1GiBs", "9223372036854775808", "8388608TiB", "1.5B"} {
		if n, err := ParseSize(bad); err == nil {
			t.Errorf("ParseSize(%q) = %d, want an error", bad, n)
		} else if !strings.Contains(err.Error(), "bad size") {
			t.Errorf("ParseSize(%q): %v, want it to say bad size", bad, err)
		}
	}
}

func TestFormatSize(t *testing.T) {
	for _, c := range []struct {
		n    int64
		want string
	}{
		{0, "0B"}, {1, "1B"}, {1000, "1KB"}, {1024, "1KiB"}, {1500, "1500B"}, {65536, "64KiB"},
		{64 << 20, "64MiB"}, {1e9, "1GB"}, {1 << 30, "1GiB"}, {1024000, "1000KiB"}, {3 << 40, "3TiB"}, {5e12, "5TB"},
	} {
		if got := FormatSize(c.n); got != c.want {
			t.Errorf("FormatSize(%d) = %q, want %q", c.n, got, c.want)
		}
	}
	// Every size reads back exactly.
	for i := 0; i < 10000; i++ {
		n := rand.Int64N(1 << uint(rand.IntN(62)+1))
		if rand.IntN(2) == 0 {
			n = n >> 20 << 20
		}
		got, err := ParseSize(FormatSize(n))
		if err != nil || got != n {
			t.Fatalf("ParseSize(FormatSize(%d) = %q) = %d, %v", n, FormatSize(n), got, err)
		}
	}
}

func TestF32(t *testing.T) {
	if got := F32(0.001); got != 0.001 {
		t.Fatalf("F32(0.001) = %v", got)
	}
	if s := fmt.Sprint(F32(0.001)); s != "0.001" {
		t.Fatalf("F32(0.001) prints %q", s)
	}
	for i := 0; i < 10000; i++ {
		f := math.Float32frombits(rand.Uint32())
		if math.IsNaN(float64(f)) || math.IsInf(float64(f), 0) {
			continue
		}
		if float32(F32(f)) != f {
			t.Fatalf("float32(F32(%v)) = %v", f, float32(F32(f)))
		}
	}
}

func TestJSONLine(t *testing.T) {
	var b bytes.Buffer
	v := map[string]any{"name": "scale<float>", "nested": map[string]int{"a": 1, "b": 2}, "list": []int{1, 2}}
	if err := JSONLine(&b, v); err != nil {
		t.Fatal(err)
	}
	s := b.String()
	if strings.Count(s, "\n") != 1 || !strings.HasSuffix(s, "\n") || !strings.Contains(s, "scale<float>") {
		t.Fatalf("JSONLine wrote %q", s)
	}
	var back map[string]any
	if err := json.Unmarshal(b.Bytes(), &back); err != nil {
		t.Fatal(err)
	}
}

// testApp is a small tool: a command with flags and arguments, a group
// with subcommands, a passthrough command, a not-built command and one
// that fails with a given status. Each action writes what it got as JSON.
func testApp(stdout, stderr *bytes.Buffer) *ucli.App {
	got := func(c *ucli.Context) error {
		return JSONLine(c.App.Writer, map[string]any{"cmd": c.Command.HelpName, "o": c.String("o"), "n": c.Int("n"), "x": c.Bool("x"), "args": c.Args().Slice()})
	}
	flags := func() []ucli.Flag {
		return []ucli.Flag{
			&ucli.StringFlag{Name: "out", Aliases: []string{"o"}},
			&ucli.IntFlag{Name: "n", Action: func(*ucli.Context, int) error { return nil }}, // any integer (-5 is a value)
			&ucli.BoolFlag{Name: "x"},
		}
	}
	return &ucli.App{
		Name:      "tool",
		Writer:    stdout,
		ErrWriter: stderr,
		Flags:     []ucli.Flag{&ucli.StringFlag{Name: "root-opt"}},
		Commands: []*ucli.Command{
			{Name: "build", Aliases: []string{"b"}, ArgsUsage: "FILE...", Flags: flags(), Action: got},
			{Name: "group", Subcommands: []*ucli.Command{
				{Name: "ls", Flags: flags(), Action: got},
				{Name: "rm", Flags: flags(), Action: got},
			}},
			{Name: "record", ArgsUsage: "-- CMD [ARGS...]", Flags: flags(), Action: got},
			{Name: "fail", Flags: flags(), Action: func(c *ucli.Context) error {
				return ucli.Exit("", c.Int("n"))
			}},
			{Name: "bad", Action: func(c *ucli.Context) error {
				return fmt.Errorf("line one\nline two")
			}},
			NotBuilt("later", "something for later", "use tool build meanwhile"),
		},
	}
}

type run struct {
	code           int
	stdout, stderr string
}

func runApp(args ...string) run {
	var o, e bytes.Buffer
	code := Main(testApp(&o, &e), append([]string{"tool"}, args...))
	return run{code, o.String(), e.String()}
}

func TestMainUsageErrors(t *testing.T) {
	for _, c := range []struct {
		args []string
		say  string
	}{
		{[]string{"frobnicate"}, `tool: usage: unknown command "frobnicate" (see tool --help)`},
		{[]string{}, "tool: usage: missing command: one of build, group, record, fail, bad, later (see tool --help)"},
		{[]string{"--bogus"}, "tool: usage: flag provided but not defined: -bogus (see tool --help)"},
		{[]string{"build", "--bogus", "a"}, "tool: usage: flag provided but not defined: -bogus (see tool build --help)"},
		{[]string{"build", "a", "--bogus"}, "tool: usage: flag provided but not defined: -bogus (see tool build --help)"},
		{[]string{"build", "-n", "many"}, `tool: usage: invalid value "many" for flag -n: parse error (see tool build --help)`},
		{[]string{"group"}, "tool: usage: missing command: one of ls, rm (see tool group --help)"},
		{[]string{"group", "mv"}, `tool: usage: unknown command "mv" (see tool group --help)`},
		{[]string{"group", "ls", "--bogus"}, "tool: usage: flag provided but not defined: -bogus (see tool group ls --help)"},
		{[]string{"help"}, `tool: usage: unknown command "help" (see tool --help)`},
		{[]string{"later", "--anything", "x"}, `tool: later: not built yet; use tool build meanwhile`},
	} {
		r := runApp(c.args...)
		if r.code != ExitUsage || r.stdout != "" || r.stderr != c.say+"\n" {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want exit 2, nothing on stdout, %q", c.args, r.code, r.stdout, r.stderr, c.say)
		}
	}
}

func TestMainFailures(t *testing.T) {
	if r := runApp("bad"); r.code != ExitFailure || r.stderr != "tool: line one line two\n" || r.stdout != "" {
		t.Errorf("bad: %+v", r)
	}
	code := 3 + rand.IntN(120)
	if r := runApp("fail", "-n", fmt.Sprint(code)); r.code != code || r.stderr != "" {
		t.Errorf("fail -n %d: %+v", code, r)
	}
}

func TestMainVersionAndHelp(t *testing.T) {
	r := runApp("--version")
	if r.code != 0 || !strings.HasPrefix(r.stdout, "tool ") || !strings.Contains(r.stdout, "(go1.") || strings.Count(r.stdout, "\n") != 1 || r.stderr != "" {
		t.Errorf("--version: %+v", r)
	}
	// --version wins over a command, which does not run.
	if r := runApp("--version", "build", "a"); r.code != 0 || strings.Contains(r.stdout, "args") {
		t.Errorf("--version build: %+v", r)
	}
	version = "v9.8.7"
	defer func() { version = "" }()
	if r := runApp("--version"); !strings.HasPrefix(r.stdout, "tool v9.8.7 (go1.") {
		t.Errorf("-ldflags version: %q", r.stdout)
	}
	for _, args := range [][]string{{"--help"}, {"build", "--help"}, {"build", "a.cu", "--help"}, {"group", "ls", "-h"}} {
		r := runApp(args...)
		if r.code != 0 || !strings.Contains(r.stdout, "USAGE") || r.stderr != "" {
			t.Errorf("%q: %+v", args, r)
		}
	}
}

func TestMainFlagsAfterArguments(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"build", "a.cu", "-o", "out", "b.cu", "-x", "--n=3"}, `{"args":["a.cu","b.cu"],"cmd":"tool build","n":3,"o":"out","x":true}`},
		{[]string{"b", "-o", "out", "a.cu"}, `{"args":["a.cu"],"cmd":"tool build","n":0,"o":"out","x":false}`},
		{[]string{"build", "-", "-o", "-"}, `{"args":["-"],"cmd":"tool build","n":0,"o":"-","x":false}`},
		{[]string{"build", "a", "--", "-o", "--x"}, `{"args":["a","-o","--x"],"cmd":"tool build","n":0,"o":"","x":false}`},
		{[]string{"--root-opt", "v", "group", "rm", "name", "-n", "-5"}, `{"args":["name"],"cmd":"tool group rm","n":-5,"o":"","x":false}`},
		// record takes a command line: flags only before it.
		{[]string{"record", "-o", "t.json", "sh", "-c", "-x"}, `{"args":["sh","-c","-x"],"cmd":"tool record","n":0,"o":"t.json","x":false}`},
		{[]string{"record", "-o", "t.json", "--", "sh", "-x"}, `{"args":["sh","-x"],"cmd":"tool record","n":0,"o":"t.json","x":false}`},
	} {
		r := runApp(c.args...)
		if r.code != 0 || strings.TrimSpace(r.stdout) != c.want {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want %s", c.args, r.code, r.stdout, r.stderr, c.want)
		}
	}
}

func TestPermute(t *testing.T) {
	var o, e bytes.Buffer
	app := testApp(&o, &e)
	for _, c := range []struct{ in, want []string }{
		{[]string{"tool"}, []string{"tool"}},
		{[]string{"tool", "build", "a", "-o", "x"}, []string{"tool", "build", "-o", "x", "--", "a"}},
		{[]string{"tool", "build", "-o=x", "a", "-x"}, []string{"tool", "build", "-o=x", "-x", "--", "a"}},
		{[]string{"tool", "later", "a", "-o", "x"}, []string{"tool", "later", "a", "-o", "x"}},
		{[]string{"tool", "unknown", "-o", "x"}, []string{"tool", "-o", "--", "unknown", "x"}},
		{[]string{"tool", "build", "a.cu", "--help"}, []string{"tool", "build", "--help"}},
		{[]string{"tool", "build", "-o"}, []string{"tool", "build", "-o"}},
	} {
		if got := Permute(app, c.in); !reflect.DeepEqual(got, c.want) {
			t.Errorf("Permute(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

func TestMessage(t *testing.T) {
	for _, c := range []struct{ err, want string }{
		{"boom", "tool: boom"},
		{"tool: already named", "tool: already named"},
		{"tool build: named", "tool build: named"},
		{"toolbox: not ours", "tool: toolbox: not ours"},
		{"two\nlines\n", "tool: two lines"},
		{"", ""},
	} {
		if got := Message("tool", errors.New(c.err)); got != c.want {
			t.Errorf("Message(%q) = %q, want %q", c.err, got, c.want)
		}
	}
}

func TestExitCode(t *testing.T) {
	for _, c := range []struct {
		err  error
		want int
	}{
		{nil, 0},
		{errors.New("x"), 1},
		{Usagef("bad %s", "x"), 2},
		{fmt.Errorf("--slab: %w", Usagef("bad")), 2},
		{fmt.Errorf("sample: %w", ErrNotBuilt), 2},
		{ucli.Exit("", 127), 127},
	} {
		if got := ExitCode(c.err); got != c.want {
			t.Errorf("ExitCode(%v) = %d, want %d", c.err, got, c.want)
		}
	}
}

// sizeApp reads --size with SizeValue and prints it back with FormatSize.
func sizeApp(o, e *bytes.Buffer) *ucli.App {
	return &ucli.App{Name: "tool", Writer: o, ErrWriter: e,
		Flags: []ucli.Flag{SizeFlag("size", "64MiB", "a size")},
		Action: func(c *ucli.Context) error {
			n, err := SizeValue(c, "size")
			if err != nil {
				return err
			}
			fmt.Fprintln(c.App.Writer, n, FormatSize(n))
			return nil
		}}
}

func TestSizeFlag(t *testing.T) {
	for _, c := range []struct{ args, stdout, stderr string }{
		{"", "67108864 64MiB\n", ""},
		{"--size 1G", "1073741824 1GiB\n", ""},
		{"--size 1GB", "1000000000 1GB\n", ""},
		{"--size 1.5KiB", "1536 1536B\n", ""},
		{"--size=", "0 0B\n", ""},
		{"--size lots", "", `tool: usage: --size: bad size "lots": want ` + SizeSyntax + "\n"},
	} {
		var o, e bytes.Buffer
		Main(sizeApp(&o, &e), append([]string{"tool"}, strings.Fields(c.args)...))
		if o.String() != c.stdout || e.String() != c.stderr {
			t.Errorf("%s: stdout %q, stderr %q; want %q, %q", c.args, o.String(), e.String(), c.stdout, c.stderr)
		}
	}
	var o, e bytes.Buffer
	Main(sizeApp(&o, &e), []string{"tool", "--help"})
	if !strings.Contains(o.String(), `(default: "64MiB")`) {
		t.Errorf("help does not show the default as spelled:\n%s", o.String())
	}
}

func TestCheckOut(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "t.json")
	run := func(path string, force bool, keep ...string) error {
		var err error
		app := &ucli.App{Name: "tool", Flags: []ucli.Flag{ForceFlag()}, Action: func(c *ucli.Context) error {
			err = CheckOut(c, "out", path, keep...)
			return nil
		}}
		args := []string{"tool"}
		if force {
			args = append(args, "--force")
		}
		if rerr := app.Run(args); rerr != nil {
			t.Fatal(rerr)
		}
		return err
	}
	if err := run(file, false); err != nil {
		t.Fatalf("a new file: %v", err)
	}
	os.WriteFile(file, []byte("{}"), 0o644)
	if err := run(file, false); err == nil || err.Error() != "--out "+file+" exists; pass --force to replace it" {
		t.Fatalf("an existing file: %v", err)
	}
	if err := run(file, true); err != nil {
		t.Fatalf("--force: %v", err)
	}
	if err := run(dir, false, "model.safetensors", "metrics.jsonl"); err != nil {
		t.Fatalf("a directory without a run: %v", err)
	}
	os.WriteFile(filepath.Join(dir, "metrics.jsonl"), nil, 0o644)
	if err := run(dir, false, "model.safetensors", "metrics.jsonl"); err == nil || !strings.Contains(err.Error(), "already holds metrics.jsonl; pass --force") {
		t.Fatalf("a directory with a run: %v", err)
	}
}

func TestCheckSocketDir(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "no", "such")
	if mk, err := CheckSocketDir(filepath.Join(dir, "p.sock"), true); mk != "" || err != nil {
		t.Errorf("existing dir: %q, %v", mk, err)
	}
	if _, err := CheckSocketDir(filepath.Join(missing, "p.sock"), true); err == nil || !strings.Contains(err.Error(), "mkdir -m 0700 "+missing) {
		t.Errorf("missing named dir: %v", err)
	}
	if mk, err := CheckSocketDir(filepath.Join(missing, "p.sock"), false); mk != missing || err != nil {
		t.Errorf("missing default dir: %q, %v", mk, err)
	}
	if _, err := os.Stat(missing); err == nil {
		t.Error("CheckSocketDir made the directory")
	}
	f := filepath.Join(dir, "file")
	os.WriteFile(f, nil, 0o644)
	if _, err := CheckSocketDir(filepath.Join(f, "p.sock"), false); err == nil || !strings.Contains(err.Error(), "not a directory") {
		t.Errorf("a file as directory: %v", err)
	}
	if mk, err := CheckSocketDir("@abstract", true); mk != "" || err != nil {
		t.Errorf("abstract: %q, %v", mk, err)
	}
}
