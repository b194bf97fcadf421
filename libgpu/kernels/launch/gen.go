//go:build ignore

// gen.go writes the typed launchers of libgpu/kernels/*.cu: for every
// source file x.cu, x_cu.go in this package, with one Go function per
// extern "C" __global__ kernel (or per kernel template: see below) whose
// parameters have the Go types of the C declaration, one Go struct per C
// struct a kernel takes by value (its layout computed from the C
// declaration and checked against the file's static_assert), and a Kernel
// name for prefetching. all_cu.go lists every kernel instance.
//
// Run it with go generate in libgpu/kernels/launch (go run gen.go);
// go run gen.go -check reports, and fails on, any difference between what
// it would write and what is there (make lint runs it).
//
// The sources are read the way the C preprocessor reads them, with a small
// preprocessor of its own (#define with ## pasting, #undef, #include of
// the directory's headers, #if/#ifdef with defined() and integer
// arithmetic), twice: once as for an sm_90a target (GPUKIT_CHECK_SM90, as
// scripts/cuda-check.sh compiles the guarded wgmma code) and once as for
// any other; a kernel of either is generated.
//
// Templates: a kernel whose name a macro pastes together from a literal
// prefix and macro arguments (add_##SUF, attn_fwd_tc##DROPSUF##_d64) is
// an instance of the template named by that prefix: the kernels of one
// file sharing a prefix share one launcher, named by the prefix, which
// takes the rest of the name (the instance, "s_f32", "_drop_d64") as an
// argument and refuses one the file does not define. Every instance of a
// template must have the same Go signature. Other kernels get one launcher
// each, with no instance argument.
//
// C types map to Go as: pointers → cuda.DevicePtr; int → int32; unsigned
// (int) → uint32; long long → int64; unsigned long long → uint64; float →
// float32; double → float64; bool → bool; char → int8; unsigned char →
// uint8; short → int16; unsigned short → uint16; a struct → a pointer to
// its generated Go struct (passed by value to the kernel).
package main

import (
	"bytes"
	"flag"
	"fmt"
	"go/format"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"unicode"
)

const srcDir = ".."

func main() {
	check := flag.Bool("check", false, "compare instead of writing; exit 1 on any difference")
	flag.Parse()
	files, err := filepath.Glob(filepath.Join(srcDir, "*.cu"))
	if err != nil || len(files) == 0 {
		fail("gen: no .cu files in %s", srcDir)
	}
	sort.Strings(files)
	g := &gen{structs: map[string]*cstruct{}, goNames: map[string]string{}}
	out := map[string][]byte{}
	for _, f := range files {
		name := filepath.Base(f)
		src, err := g.file(name)
		if err != nil {
			fail("gen: %s: %v", name, err)
		}
		out[strings.TrimSuffix(name, ".cu")+"_cu.go"] = src
	}
	out["all_cu.go"] = g.index()
	if *check {
		os.Exit(compare(out))
	}
	old, _ := filepath.Glob("*_cu.go")
	for _, f := range old {
		if _, ok := out[f]; !ok {
			if err := os.Remove(f); err != nil {
				fail("gen: %v", err)
			}
		}
	}
	for f, b := range out {
		if err := os.WriteFile(f, b, 0o644); err != nil {
			fail("gen: %v", err)
		}
	}
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, format+"\n", args...)
	os.Exit(1)
}

// compare reports the generated files that differ from, are missing from
// or are extra in the directory.
func compare(out map[string][]byte) int {
	bad := 0
	for f, b := range out {
		have, err := os.ReadFile(f)
		if err != nil || !bytes.Equal(have, b) {
			fmt.Fprintf(os.Stderr, "libgpu/kernels/launch/%s is not what gen.go writes from the kernels (run go generate ./libgpu/kernels/launch)\n", f)
			bad = 1
		}
	}
	old, _ := filepath.Glob("*_cu.go")
	for _, f := range old {
		if _, ok := out[f]; !ok {
			fmt.Fprintf(os.Stderr, "libgpu/kernels/launch/%s has no kernel source any more (run go generate ./libgpu/kernels/launch)\n", f)
			bad = 1
		}
	}
	return bad
}

// ---- tokens ----

type tokKind uint8

const (
	tIdent tokKind = iota
	tNumber
	tString
	tChar
	tPunct
)

type tok struct {
	s    string
	kind tokKind
	// tmpl: the identifier was pasted together by ## in a macro body
	// from a literal prefix (prefix) and arguments.
	tmpl   bool
	prefix string
	// fromArg: the token was substituted from a macro argument (during
	// that macro's pasting only).
	fromArg bool
	// noexp: a macro name met while that macro was being expanded (never
	// expanded again, as the standard says).
	noexp bool
	// space: whitespace preceded the token (for stringizing and printing).
	space bool
}

var puncts3 = []string{"<<=", ">>=", "..."}
var puncts2 = []string{"##", "::", "->", "++", "--", "<<", ">>", "<=", ">=", "==", "!=", "&&", "||", "+=", "-=", "*=", "/=", "%=", "&=", "|=", "^="}

func tokenize(s string) ([]tok, error) {
	var ts []tok
	space := false
	for i := 0; i < len(s); {
		c := s[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v':
			space = true
			i++
			continue
		case c == '_' || unicode.IsLetter(rune(c)):
			j := i + 1
			for j < len(s) && (s[j] == '_' || unicode.IsLetter(rune(s[j])) || unicode.IsDigit(rune(s[j]))) {
				j++
			}
			ts = append(ts, tok{s: s[i:j], kind: tIdent, space: space})
			i = j
		case unicode.IsDigit(rune(c)) || (c == '.' && i+1 < len(s) && unicode.IsDigit(rune(s[i+1]))):
			j := i + 1
			for j < len(s) && (s[j] == '_' || s[j] == '.' || unicode.IsLetter(rune(s[j])) || unicode.IsDigit(rune(s[j])) ||
				((s[j] == '+' || s[j] == '-') && (s[j-1] == 'e' || s[j-1] == 'E' || s[j-1] == 'p' || s[j-1] == 'P'))) {
				j++
			}
			ts = append(ts, tok{s: s[i:j], kind: tNumber, space: space})
			i = j
		case c == '"' || c == '\'':
			j := i + 1
			for j < len(s) && s[j] != c {
				if s[j] == '\\' {
					j++
				}
				j++
			}
			if j >= len(s) {
				return nil, fmt.Errorf("unterminated literal")
			}
			k := tString
			if c == '\'' {
				k = tChar
			}
			ts = append(ts, tok{s: s[i : j+1], kind: k, space: space})
			i = j + 1
		default:
			p := string(c)
			for _, q := range puncts3 {
				if strings.HasPrefix(s[i:], q) {
					p = q
				}
			}
			if len(p) == 1 {
				for _, q := range puncts2 {
					if strings.HasPrefix(s[i:], q) {
						p = q
					}
				}
			}
			ts = append(ts, tok{s: p, kind: tPunct, space: space})
			i += len(p)
		}
		space = false
	}
	return ts, nil
}

// stripComments removes // and /* */ comments (kept: string and char
// literals), after backslash-newline splicing, keeping line breaks.
func stripComments(s string) string {
	s = strings.ReplaceAll(s, "\\\r\n", "")
	s = strings.ReplaceAll(s, "\\\n", "")
	var b strings.Builder
	for i := 0; i < len(s); {
		switch {
		case strings.HasPrefix(s[i:], "//"):
			for i < len(s) && s[i] != '\n' {
				i++
			}
		case strings.HasPrefix(s[i:], "/*"):
			j := strings.Index(s[i+2:], "*/")
			if j < 0 {
				j = len(s) - i - 2
			}
			b.WriteByte(' ')
			b.WriteString(strings.Repeat("\n", strings.Count(s[i:i+2+j], "\n")))
			i += j + 4
		case s[i] == '"' || s[i] == '\'':
			q := s[i]
			j := i + 1
			for j < len(s) && s[j] != q && s[j] != '\n' {
				if s[j] == '\\' {
					j++
				}
				j++
			}
			b.WriteString(s[i:min(j+1, len(s))])
			i = j + 1
		default:
			b.WriteByte(s[i])
			i++
		}
	}
	return b.String()
}

// ---- the preprocessor ----

type macro struct {
	fn     bool
	params []string
	va     bool
	body   []tok
}

type pp struct {
	macros map[string]*macro
	out    []tok
	seen   map[string]bool // headers included (#pragma once)
}

func newPP(defines ...string) *pp {
	p := &pp{macros: map[string]*macro{}, seen: map[string]bool{}}
	for _, d := range defines {
		p.macros[d] = &macro{body: []tok{{s: "1", kind: tNumber}}}
	}
	return p
}

// run preprocesses file (a .cu or .cuh of srcDir), appending the tokens of
// its text lines to p.out.
func (p *pp) run(file string) error {
	b, err := os.ReadFile(filepath.Join(srcDir, file))
	if err != nil {
		return err
	}
	lines := strings.Split(stripComments(string(b)), "\n")
	// cond: per open #if, whether its current branch is taken, whether
	// one was, and whether the enclosing ones are.
	type cond struct{ on, done, outer bool }
	var stack []cond
	active := func() bool { return len(stack) == 0 || (stack[len(stack)-1].on && stack[len(stack)-1].outer) }
	var text []string
	flush := func() error {
		if len(text) == 0 {
			return nil
		}
		ts, err := tokenize(strings.Join(text, "\n"))
		text = text[:0]
		if err != nil {
			return err
		}
		p.out = append(p.out, p.expand(ts, nil)...)
		return nil
	}
	for n, line := range lines {
		t := strings.TrimSpace(line)
		if !strings.HasPrefix(t, "#") {
			if active() {
				text = append(text, line)
			}
			continue
		}
		if err := flush(); err != nil {
			return fmt.Errorf("%s:%d: %v", file, n+1, err)
		}
		t = strings.TrimSpace(t[1:])
		dir, rest, _ := strings.Cut(t, " ")
		if i := strings.IndexAny(t, " \t("); i >= 0 && (dir == t || strings.ContainsAny(dir, "\t(")) {
			dir, rest = t[:i], t[i:]
		}
		rest = strings.TrimSpace(rest)
		where := func(err error) error { return fmt.Errorf("%s:%d: #%s: %v", file, n+1, dir, err) }
		switch dir {
		case "if", "ifdef", "ifndef":
			outer := active()
			on := false
			if outer {
				var err error
				switch dir {
				case "ifdef":
					on = p.macros[rest] != nil
				case "ifndef":
					on = p.macros[rest] == nil
				default:
					if on, err = p.cond(rest); err != nil {
						return where(err)
					}
				}
			}
			stack = append(stack, cond{on: on, done: on, outer: outer})
		case "elif":
			if len(stack) == 0 {
				return where(fmt.Errorf("without #if"))
			}
			c := &stack[len(stack)-1]
			c.on = false
			if c.outer && !c.done {
				on, err := p.cond(rest)
				if err != nil {
					return where(err)
				}
				c.on, c.done = on, on
			}
		case "else":
			if len(stack) == 0 {
				return where(fmt.Errorf("without #if"))
			}
			c := &stack[len(stack)-1]
			c.on, c.done = !c.done, true
		case "endif":
			if len(stack) == 0 {
				return where(fmt.Errorf("without #if"))
			}
			stack = stack[:len(stack)-1]
		case "define":
			if !active() {
				continue
			}
			if err := p.define(rest); err != nil {
				return where(err)
			}
		case "undef":
			if active() {
				delete(p.macros, rest)
			}
		case "include":
			if !active() {
				continue
			}
			h, err := strconv.Unquote(rest)
			if err != nil || strings.Contains(h, "/") {
				return where(fmt.Errorf("only the directory's own headers can be included (%s)", rest))
			}
			if p.seen[h] {
				continue
			}
			p.seen[h] = true
			if err := p.run(h); err != nil {
				return err
			}
		case "pragma", "error", "warning", "line", "":
		default:
			return where(fmt.Errorf("unknown directive"))
		}
	}
	if len(stack) != 0 {
		return fmt.Errorf("%s: unterminated #if", file)
	}
	return flush()
}

func (p *pp) define(s string) error {
	i := 0
	for i < len(s) && (s[i] == '_' || unicode.IsLetter(rune(s[i])) || unicode.IsDigit(rune(s[i]))) {
		i++
	}
	name := s[:i]
	if name == "" {
		return fmt.Errorf("no macro name")
	}
	m := &macro{}
	rest := s[i:]
	if strings.HasPrefix(rest, "(") {
		j := strings.Index(rest, ")")
		if j < 0 {
			return fmt.Errorf("unterminated parameter list")
		}
		m.fn = true
		for _, prm := range strings.Split(rest[1:j], ",") {
			prm = strings.TrimSpace(prm)
			switch {
			case prm == "" && len(strings.TrimSpace(rest[1:j])) == 0:
			case prm == "...":
				m.va = true
				m.params = append(m.params, "__VA_ARGS__")
			default:
				m.params = append(m.params, prm)
			}
		}
		rest = rest[j+1:]
	}
	body, err := tokenize(rest)
	if err != nil {
		return err
	}
	m.body = body
	p.macros[name] = m
	return nil
}

func (p *pp) param(m *macro, s string) int {
	for i, q := range m.params {
		if q == s {
			return i
		}
	}
	return -1
}

// expand macro-expands ts; disabled holds the macros being expanded.
func (p *pp) expand(ts []tok, disabled map[string]bool) []tok {
	var out []tok
	for i := 0; i < len(ts); i++ {
		t := ts[i]
		m := p.macros[t.s]
		if t.kind != tIdent || m == nil || t.noexp {
			out = append(out, t)
			continue
		}
		if disabled[t.s] {
			t.noexp = true
			out = append(out, t)
			continue
		}
		var args [][]tok
		if m.fn {
			if i+1 >= len(ts) || ts[i+1].s != "(" {
				out = append(out, t)
				continue
			}
			var end int
			args, end = splitArgs(ts, i+1)
			if end < 0 {
				out = append(out, t)
				continue
			}
			if len(m.params) == 0 && len(args) == 1 && len(args[0]) == 0 {
				args = nil
			}
			if m.va && len(args) > len(m.params) {
				va := args[len(m.params)-1]
				for _, a := range args[len(m.params):] {
					va = append(append(va, tok{s: ",", kind: tPunct}), a...)
				}
				args = append(args[:len(m.params)-1], va)
			}
			for len(args) < len(m.params) {
				args = append(args, nil)
			}
			i = end
		}
		body := p.substitute(m, args, disabled)
		inner := map[string]bool{t.s: true}
		for k := range disabled {
			inner[k] = true
		}
		exp := p.expand(body, inner)
		if len(exp) > 0 {
			exp[0].space = t.space
		}
		out = append(out, exp...)
	}
	return out
}

// splitArgs reads the arguments of a macro call whose "(" is ts[open];
// end is the index of the closing ")" (-1: none).
func splitArgs(ts []tok, open int) (args [][]tok, end int) {
	depth := 0
	cur := []tok{}
	for j := open; j < len(ts); j++ {
		switch ts[j].s {
		case "(":
			depth++
			if depth == 1 {
				continue
			}
		case ")":
			depth--
			if depth == 0 {
				return append(args, cur), j
			}
		case ",":
			if depth == 1 {
				args = append(args, cur)
				cur = []tok{}
				continue
			}
		}
		cur = append(cur, ts[j])
	}
	return nil, -1
}

// substitute replaces m's parameters in its body by the arguments (fully
// expanded, unless next to # or ##) and performs the pastes.
func (p *pp) substitute(m *macro, args [][]tok, disabled map[string]bool) []tok {
	type item struct {
		ts    []tok
		paste bool // a ## operator
	}
	var items []item
	body := m.body
	for i := 0; i < len(body); i++ {
		t := body[i]
		if t.s == "##" {
			items = append(items, item{paste: true})
			continue
		}
		if m.fn && t.s == "#" && i+1 < len(body) && p.param(m, body[i+1].s) >= 0 {
			var sb strings.Builder
			for k, a := range args[p.param(m, body[i+1].s)] {
				if k > 0 && a.space {
					sb.WriteByte(' ')
				}
				sb.WriteString(a.s)
			}
			items = append(items, item{ts: []tok{{s: strconv.Quote(sb.String()), kind: tString, space: t.space}}})
			i++
			continue
		}
		if k := p.param(m, t.s); m.fn && t.kind == tIdent && k >= 0 {
			pasted := (i > 0 && body[i-1].s == "##") || (i+1 < len(body) && body[i+1].s == "##")
			a := args[k]
			if !pasted {
				a = p.expand(a, disabled)
			}
			c := make([]tok, len(a))
			for j := range a {
				c[j] = a[j]
				c[j].fromArg = true
			}
			if len(c) > 0 {
				c[0].space = t.space
			}
			items = append(items, item{ts: c})
			continue
		}
		t.fromArg = false
		items = append(items, item{ts: []tok{t}})
	}
	// Pastes, left to right: the last token of the left operand joins the
	// first of the right one (an empty operand is a placemarker).
	var out []tok
	for i := 0; i < len(items); i++ {
		it := items[i]
		if !it.paste {
			out = append(out, it.ts...)
			continue
		}
		if i+1 >= len(items) || items[i+1].paste {
			continue
		}
		right := items[i+1].ts
		i++
		if len(right) == 0 {
			// x ## <empty>: x stays, but is now a template's pasted name.
			if len(out) > 0 {
				l := &out[len(out)-1]
				if l.kind == tIdent && !l.tmpl && !l.fromArg {
					l.tmpl, l.prefix = true, l.s
				}
			}
			continue
		}
		if len(out) == 0 {
			out = append(out, right...)
			continue
		}
		l := out[len(out)-1]
		r := right[0]
		n := tok{s: l.s + r.s, kind: l.kind, space: l.space}
		if l.kind == tIdent || l.kind == tNumber {
			n.kind = l.kind
		}
		switch {
		case l.tmpl:
			n.tmpl, n.prefix = true, l.prefix
		case !l.fromArg && l.kind == tIdent:
			n.tmpl, n.prefix = true, l.s
		}
		out[len(out)-1] = n
		out = append(out, right[1:]...)
	}
	for i := range out {
		out[i].fromArg = false
	}
	return out
}

// cond evaluates an #if expression.
func (p *pp) cond(s string) (bool, error) {
	ts, err := tokenize(s)
	if err != nil {
		return false, err
	}
	// defined(X) and defined X first, then expansion; other identifiers
	// are 0.
	var pre []tok
	for i := 0; i < len(ts); i++ {
		if ts[i].s == "defined" {
			name := ""
			switch {
			case i+3 < len(ts)+0 && i+1 < len(ts) && ts[i+1].s == "(" && i+3 < len(ts) && ts[i+3].s == ")":
				name = ts[i+2].s
				i += 3
			case i+1 < len(ts):
				name = ts[i+1].s
				i++
			}
			v := "0"
			if p.macros[name] != nil {
				v = "1"
			}
			pre = append(pre, tok{s: v, kind: tNumber})
			continue
		}
		pre = append(pre, ts[i])
	}
	v, err := evalInt(p.expand(pre, nil))
	return v != 0, err
}

// evalInt evaluates an integer constant expression (#if and array sizes):
// literals, identifiers (0), unary - + ! ~, * / %, + -, << >>, < <= > >=,
// == !=, &, ^, |, &&, ||, ?:, parentheses, and casts to (int) and the like.
func evalInt(ts []tok) (int64, error) {
	e := &expr{ts: ts}
	v, err := e.ternary()
	if err != nil {
		return 0, err
	}
	if e.i != len(e.ts) {
		return 0, fmt.Errorf("unexpected %q in expression", e.ts[e.i].s)
	}
	return v, nil
}

type expr struct {
	ts []tok
	i  int
}

func (e *expr) peek() string {
	if e.i < len(e.ts) {
		return e.ts[e.i].s
	}
	return ""
}

func (e *expr) ternary() (int64, error) {
	c, err := e.binary(0)
	if err != nil || e.peek() != "?" {
		return c, err
	}
	e.i++
	a, err := e.ternary()
	if err != nil {
		return 0, err
	}
	if e.peek() != ":" {
		return 0, fmt.Errorf("missing : in ?:")
	}
	e.i++
	b, err := e.ternary()
	if c != 0 {
		return a, err
	}
	return b, err
}

var precedence = map[string]int{"||": 1, "&&": 2, "|": 3, "^": 4, "&": 5, "==": 6, "!=": 6,
	"<": 7, "<=": 7, ">": 7, ">=": 7, "<<": 8, ">>": 8, "+": 9, "-": 9, "*": 10, "/": 10, "%": 10}

func (e *expr) binary(min int) (int64, error) {
	l, err := e.unary()
	if err != nil {
		return 0, err
	}
	for {
		op := e.peek()
		pr, ok := precedence[op]
		if !ok || pr <= min {
			return l, nil
		}
		e.i++
		r, err := e.binary(pr)
		if err != nil {
			return 0, err
		}
		b := func(x bool) int64 {
			if x {
				return 1
			}
			return 0
		}
		switch op {
		case "||":
			l = b(l != 0 || r != 0)
		case "&&":
			l = b(l != 0 && r != 0)
		case "|":
			l |= r
		case "^":
			l ^= r
		case "&":
			l &= r
		case "==":
			l = b(l == r)
		case "!=":
			l = b(l != r)
		case "<":
			l = b(l < r)
		case "<=":
			l = b(l <= r)
		case ">":
			l = b(l > r)
		case ">=":
			l = b(l >= r)
		case "<<":
			l <<= r
		case ">>":
			l >>= r
		case "+":
			l += r
		case "-":
			l -= r
		case "*":
			l *= r
		case "/", "%":
			if r == 0 {
				return 0, fmt.Errorf("division by zero")
			}
			if op == "/" {
				l /= r
			} else {
				l %= r
			}
		}
	}
}

func (e *expr) unary() (int64, error) {
	if e.i >= len(e.ts) {
		return 0, fmt.Errorf("expression ends early")
	}
	t := e.ts[e.i]
	switch t.s {
	case "-", "+", "!", "~":
		e.i++
		v, err := e.unary()
		switch t.s {
		case "-":
			v = -v
		case "!":
			if v == 0 {
				v = 1
			} else {
				v = 0
			}
		case "~":
			v = ^v
		}
		return v, err
	case "(":
		// A cast to an integer type is skipped.
		j := e.i + 1
		for j < len(e.ts) && cIntWords[e.ts[j].s] {
			j++
		}
		if j > e.i+1 && j < len(e.ts) && e.ts[j].s == ")" {
			e.i = j + 1
			return e.unary()
		}
		e.i++
		v, err := e.ternary()
		if err != nil {
			return 0, err
		}
		if e.peek() != ")" {
			return 0, fmt.Errorf("missing )")
		}
		e.i++
		return v, nil
	}
	e.i++
	switch t.kind {
	case tNumber:
		s := strings.TrimRight(strings.ToLower(t.s), "ul")
		return strconv.ParseInt(s, 0, 64)
	case tIdent:
		return 0, nil
	case tChar:
		v, _, _, err := strconv.UnquoteChar(t.s[1:len(t.s)-1], '\'')
		return int64(v), err
	}
	return 0, fmt.Errorf("unexpected %q in expression", t.s)
}

var cIntWords = map[string]bool{"int": true, "unsigned": true, "signed": true, "long": true, "short": true, "char": true}

// ---- declarations ----

// ctype is a C type as a kernel parameter or struct field sees it.
type ctype struct {
	c      string   // as written, qualifiers dropped ("float*", "unsigned long long")
	ptr    bool     // any pointer
	scalar string   // the Go scalar type, for a non-pointer non-struct
	st     *cstruct // a struct by value
}

func (t ctype) goType() string {
	switch {
	case t.ptr:
		return "cuda.DevicePtr"
	case t.st != nil:
		return t.st.goName
	}
	return t.scalar
}

func (t ctype) size() (size, align int64) {
	switch {
	case t.ptr:
		return 8, 8
	case t.st != nil:
		return t.st.size, t.st.align
	}
	switch t.scalar {
	case "int8", "uint8", "bool":
		return 1, 1
	case "int16", "uint16":
		return 2, 2
	case "int32", "uint32", "float32":
		return 4, 4
	}
	return 8, 8
}

var cScalars = map[string]string{
	"int": "int32", "signed": "int32", "signed int": "int32", "unsigned": "uint32", "unsigned int": "uint32",
	"long long": "int64", "long long int": "int64", "signed long long": "int64",
	"unsigned long long": "uint64", "unsigned long long int": "uint64",
	"long": "int64", "unsigned long": "uint64",
	"float": "float32", "double": "float64", "bool": "bool",
	"char": "int8", "signed char": "int8", "unsigned char": "uint8",
	"short": "int16", "unsigned short": "uint16",
}

var cQualifiers = map[string]bool{"const": true, "volatile": true, "__restrict__": true, "__restrict": true,
	"restrict": true, "__grid_constant__": true, "struct": true, "__device_builtin__": true}

type field struct {
	cname, goName string
	t             ctype
	n             int64 // array length; 0: not an array
}

type cstruct struct {
	cname, goName, file string
	fields              []field
	size, align         int64
	asserted            int64 // the static_assert's size, 0: none
	used                bool
	// emitted: written into its file's output already (as a struct nested
	// in another file's kernel arguments, before a later file's kernel
	// took it directly); it stays there.
	emitted bool
}

type param struct {
	cname, goName string
	t             ctype
}

type kernel struct {
	file, name string
	tmpl       bool   // an instance of a template
	prefix     string // the template's name (tmpl)
	params     []param
	decl       string // the C declaration's parameter list
}

type gen struct {
	structs  map[string]*cstruct
	typedefs map[string][]tok
	goNames  map[string]string // Go identifier -> what it is, for collisions
	all      []*kernel
}

// declarations reads the preprocessed tokens of one file: typedefs,
// structs, static_asserts on struct sizes and extern "C" __global__
// kernels.
func (g *gen) declarations(file string, ts []tok) ([]*kernel, error) {
	var ks []*kernel
	depth := 0
	for i := 0; i < len(ts); i++ {
		t := ts[i]
		switch t.s {
		case "{":
			depth++
			continue
		case "}":
			depth--
			continue
		}
		if depth != 0 {
			continue
		}
		switch {
		case t.s == "typedef":
			j := i + 1
			for j < len(ts) && ts[j].s != ";" {
				j++
			}
			if j < len(ts) && j-i >= 3 && ts[j-1].kind == tIdent {
				g.typedefs[ts[j-1].s] = ts[i+1 : j-1]
			}
			i = j
		case t.s == "struct" && i+2 < len(ts) && !(i > 0 && ts[i-1].s == ">"):
			// struct NAME { ... } or struct __align__(N) NAME { ... }
			j, align := i+1, int64(1)
			if ts[j].s == "__align__" && j+4 < len(ts) && ts[j+1].s == "(" && ts[j+3].s == ")" {
				n, err := strconv.ParseInt(ts[j+2].s, 0, 64)
				if err != nil || n < 1 || n&(n-1) != 0 {
					return nil, fmt.Errorf("struct alignment %q", ts[j+2].s)
				}
				j, align = j+4, n
			}
			if j+1 >= len(ts) || ts[j].kind != tIdent || ts[j+1].s != "{" {
				continue
			}
			end := matching(ts, j+1)
			if end < 0 {
				return nil, fmt.Errorf("struct %s: no closing brace", ts[j].s)
			}
			if _, dup := g.structs[ts[j].s]; !dup {
				if err := g.parseStruct(file, ts[j].s, ts[j+2:end], align); err != nil {
					return nil, err
				}
			}
			i = end
		case t.s == "static_assert" && i+6 < len(ts) && ts[i+1].s == "(" && ts[i+2].s == "sizeof":
			// static_assert(sizeof(NAME) == N, ...)
			if ts[i+3].s == "(" && ts[i+5].s == ")" && ts[i+6].s == "==" && i+7 < len(ts) {
				if st := g.structs[ts[i+4].s]; st != nil {
					n, err := strconv.ParseInt(ts[i+7].s, 0, 64)
					if err == nil {
						st.asserted = n
					}
				}
			}
		case t.s == "extern" && i+1 < len(ts) && ts[i+1].s == `"C"`:
			k, end, err := g.parseKernel(file, ts, i+2)
			if err != nil {
				return nil, err
			}
			if k != nil {
				ks = append(ks, k)
			}
			i = end
		}
	}
	return ks, nil
}

// matching returns the index of the bracket closing ts[open].
func matching(ts []tok, open int) int {
	o := ts[open].s
	c := map[string]string{"{": "}", "(": ")", "[": "]"}[o]
	depth := 0
	for j := open; j < len(ts); j++ {
		switch ts[j].s {
		case o:
			depth++
		case c:
			depth--
			if depth == 0 {
				return j
			}
		}
	}
	return -1
}

// ctypeOf reads a type from tokens (qualifiers dropped, typedefs
// resolved); the last identifier is the name when named.
func (g *gen) ctypeOf(ts []tok, named bool) (ctype, string, error) {
	var words []string
	ptr := false
	for _, t := range ts {
		switch {
		case cQualifiers[t.s]:
		case t.s == "*" || t.s == "&":
			ptr = true
		case t.kind == tIdent:
			words = append(words, t.s)
		default:
			return ctype{}, "", fmt.Errorf("cannot read type %q", joinToks(ts))
		}
	}
	name := ""
	if named && len(words) >= 2 {
		name, words = words[len(words)-1], words[:len(words)-1]
	} else if named && len(words) == 1 && ptr {
		// "float*" unnamed
	}
	if len(words) == 0 {
		return ctype{}, "", fmt.Errorf("no type in %q", joinToks(ts))
	}
	// Resolve a typedef of one word.
	if len(words) == 1 {
		if def, ok := g.typedefs[words[0]]; ok {
			t, _, err := g.ctypeOf(def, false)
			if err != nil {
				return ctype{}, "", err
			}
			t.ptr = t.ptr || ptr
			if t.ptr {
				t.c = strings.Join(words, " ") + "*"
			}
			return t, name, nil
		}
	}
	c := strings.Join(words, " ")
	if ptr {
		return ctype{c: c + "*", ptr: true}, name, nil
	}
	if s, ok := cScalars[c]; ok {
		return ctype{c: c, scalar: s}, name, nil
	}
	if st, ok := g.structs[c]; ok && len(words) == 1 {
		return ctype{c: c, st: st}, name, nil
	}
	return ctype{}, "", fmt.Errorf("unknown type %q", c)
}

func (g *gen) parseStruct(file, name string, body []tok, align int64) error {
	st := &cstruct{cname: name, goName: upperCamel(name), file: file, align: align}
	for len(body) > 0 {
		j := 0
		for j < len(body) && body[j].s != ";" {
			j++
		}
		decl := body[:j]
		if j < len(body) {
			body = body[j+1:]
		} else {
			body = nil
		}
		if len(decl) == 0 {
			continue
		}
		// type declarator (, declarator)*; a declarator is [*]name[[N]].
		var parts [][]tok
		cur := []tok{}
		depth := 0
		for _, t := range decl {
			switch t.s {
			case "[", "(":
				depth++
			case "]", ")":
				depth--
			}
			if t.s == "," && depth == 0 {
				parts = append(parts, cur)
				cur = []tok{}
				continue
			}
			cur = append(cur, t)
		}
		parts = append(parts, cur)
		// The base type: the first part up to its last identifier (before
		// any [ ]).
		first := parts[0]
		nameAt := -1
		for k, t := range first {
			if t.s == "[" {
				break
			}
			if t.kind == tIdent && !cQualifiers[t.s] {
				nameAt = k
			}
		}
		if nameAt <= 0 {
			return fmt.Errorf("struct %s: cannot read %q", name, joinToks(decl))
		}
		var base []tok
		for _, t := range first[:nameAt] {
			if t.s != "*" {
				base = append(base, t)
			}
		}
		parts[0] = first[nameAt:]
		for k, prt := range parts {
			ptr := false
			if k == 0 {
				for _, t := range first[:nameAt] {
					ptr = ptr || t.s == "*"
				}
			}
			for len(prt) > 0 && prt[0].s == "*" {
				ptr = true
				prt = prt[1:]
			}
			if len(prt) == 0 || prt[0].kind != tIdent {
				return fmt.Errorf("struct %s: cannot read %q", name, joinToks(decl))
			}
			fname := prt[0].s
			tts := append([]tok(nil), base...)
			if ptr {
				tts = append(tts, tok{s: "*", kind: tPunct})
			}
			ct, _, err := g.ctypeOf(tts, false)
			if err != nil {
				return fmt.Errorf("struct %s field %s: %v", name, fname, err)
			}
			f := field{cname: fname, goName: upperCamel(fname), t: ct}
			if len(prt) > 1 {
				if prt[1].s != "[" || prt[len(prt)-1].s != "]" {
					return fmt.Errorf("struct %s field %s: cannot read %q", name, fname, joinToks(prt))
				}
				n, err := evalInt(prt[2 : len(prt)-1])
				if err != nil || n <= 0 {
					return fmt.Errorf("struct %s field %s: array size %q: %v", name, fname, joinToks(prt[2:len(prt)-1]), err)
				}
				f.n = n
			}
			st.fields = append(st.fields, f)
		}
	}
	seen := map[string]bool{}
	var off int64
	for _, f := range st.fields {
		if seen[f.goName] {
			return fmt.Errorf("struct %s: two fields are %s in Go", name, f.goName)
		}
		seen[f.goName] = true
		sz, al := f.t.size()
		if f.n > 0 {
			sz *= f.n
		}
		off = (off + al - 1) / al * al
		off += sz
		st.align = max(st.align, al)
	}
	st.size = (off + st.align - 1) / st.align * st.align
	g.structs[name] = st
	return nil
}

// parseKernel reads a declaration after extern "C" at ts[i]: a kernel
// when it has __global__ (nil otherwise); end is its last token.
func (g *gen) parseKernel(file string, ts []tok, i int) (*kernel, int, error) {
	global := false
	j := i
	name := -1
	for ; j < len(ts); j++ {
		s := ts[j].s
		if s == "__launch_bounds__" && j+1 < len(ts) && ts[j+1].s == "(" {
			j = matching(ts, j+1)
			if j < 0 {
				return nil, len(ts), fmt.Errorf("__launch_bounds__ unclosed")
			}
			continue
		}
		if s == "__global__" {
			global = true
		}
		if s == "(" {
			break
		}
		if s == ";" || s == "{" {
			return nil, j, nil
		}
		if ts[j].kind == tIdent {
			name = j
		}
	}
	if j >= len(ts) || name < 0 {
		return nil, j, fmt.Errorf("cannot read an extern \"C\" declaration")
	}
	close := matching(ts, j)
	if close < 0 {
		return nil, len(ts), fmt.Errorf("%s: unclosed parameter list", ts[name].s)
	}
	if !global {
		return nil, close, nil
	}
	nt := ts[name]
	k := &kernel{file: file, name: nt.s, tmpl: nt.tmpl && nt.prefix != "" && nt.prefix != nt.s, prefix: nt.prefix,
		decl: joinToks(ts[j+1 : close])}
	if !k.tmpl {
		k.prefix = k.name
	}
	var parts [][]tok
	cur := []tok{}
	depth := 0
	for _, t := range ts[j+1 : close] {
		switch t.s {
		case "(", "[", "<":
			depth++
		case ")", "]", ">":
			depth--
		}
		if t.s == "," && depth == 0 {
			parts = append(parts, cur)
			cur = []tok{}
			continue
		}
		cur = append(cur, t)
	}
	if len(cur) > 0 || len(parts) > 0 {
		parts = append(parts, cur)
	}
	if len(parts) == 1 && len(parts[0]) == 1 && parts[0][0].s == "void" {
		parts = nil
	}
	for n, prt := range parts {
		ct, pname, err := g.ctypeOf(prt, true)
		if err != nil {
			return nil, close, fmt.Errorf("kernel %s parameter %d: %v", k.name, n+1, err)
		}
		if ct.st != nil {
			if !ct.st.used && !ct.st.emitted {
				// A struct of a header several files include is emitted
				// with the first (in file order) of the kernels taking it.
				ct.st.file = file
			}
			ct.st.used = true
		}
		k.params = append(k.params, param{cname: pname, t: ct})
	}
	return k, close, nil
}

func joinToks(ts []tok) string {
	var b strings.Builder
	for i, t := range ts {
		if i > 0 && (t.space || (t.kind == tIdent && ts[i-1].kind == tIdent)) && t.s != "*" && t.s != "," && t.s != ")" {
			b.WriteByte(' ')
		}
		b.WriteString(t.s)
	}
	return b.String()
}

// ---- names ----

// upperCamel is the exported Go name of a C identifier: act_args →
// ActArgs, w_ → W_, s0 → S0.
func upperCamel(s string) string {
	parts := strings.Split(s, "_")
	var b strings.Builder
	for i, p := range parts {
		if p == "" {
			if i > 0 && i == len(parts)-1 {
				b.WriteByte('_')
			}
			continue
		}
		b.WriteString(strings.ToUpper(p[:1]) + p[1:])
	}
	return b.String()
}

// lowerCamel is a Go parameter name for a C one.
func lowerCamel(s string) string {
	u := upperCamel(s)
	if u == "" {
		return ""
	}
	i := 0
	for i < len(u) && unicode.IsUpper(rune(u[i])) {
		i++
	}
	switch {
	case i == len(u):
		u = strings.ToLower(u)
	case i > 1:
		u = strings.ToLower(u[:i-1]) + u[i-1:]
	default:
		u = strings.ToLower(u[:1]) + u[1:]
	}
	return u
}

var goReserved = map[string]bool{
	"break": true, "case": true, "chan": true, "const": true, "continue": true, "default": true, "defer": true,
	"else": true, "fallthrough": true, "for": true, "func": true, "go": true, "goto": true, "if": true,
	"import": true, "interface": true, "map": true, "package": true, "range": true, "return": true,
	"select": true, "struct": true, "switch": true, "type": true, "var": true,
	// the launchers' own parameters and names
	"l": true, "inst": true, "grid": true, "block": true, "smem": true, "kn": true, "kerr": true,
	"cuda": true, "unsafe": true, "len": true, "cap": true, "copy": true, "new": true, "make": true,
}

// ---- output ----

// group is one launcher: a template's instances, or one plain kernel.
type group struct {
	file, prefix, goName string
	tmpl                 bool
	ks                   []*kernel
}

func (g *gen) file(name string) ([]byte, error) {
	g.typedefs = map[string][]tok{}
	var ks []*kernel
	seen := map[string]*kernel{}
	for _, defs := range [][]string{{"__CUDACC_RTC__", "GPUKIT_CHECK_SM90"}, {"__CUDACC_RTC__"}} {
		p := newPP(defs...)
		if err := p.run(name); err != nil {
			return nil, err
		}
		found, err := g.declarations(name, p.out)
		if err != nil {
			return nil, err
		}
		for _, k := range found {
			if old, ok := seen[k.name]; ok {
				if sig(old) != sig(k) {
					return nil, fmt.Errorf("kernel %s is declared (%s) and (%s)", k.name, old.decl, k.decl)
				}
				continue
			}
			seen[k.name] = k
			ks = append(ks, k)
		}
	}
	dtypeTemplates(ks)
	// Groups, in the order of their first kernel.
	var groups []*group
	byPrefix := map[string]*group{}
	for _, k := range ks {
		key := k.prefix
		if !k.tmpl {
			// A plain kernel that an instance of a template also names was
			// seen above; one whose name is a template's prefix stands alone.
			key = "\x00" + k.name
		}
		gr := byPrefix[key]
		if gr == nil {
			gr = &group{file: name, prefix: k.prefix, tmpl: k.tmpl, goName: upperCamel(strings.TrimRight(k.prefix, "_"))}
			byPrefix[key] = gr
			groups = append(groups, gr)
		}
		if len(gr.ks) > 0 && sig(gr.ks[0]) != sig(k) {
			return nil, fmt.Errorf("template %s: %s (%s) and %s (%s) differ in Go types", k.prefix, gr.ks[0].name, gr.ks[0].decl, k.name, k.decl)
		}
		gr.ks = append(gr.ks, k)
	}
	// Instances never start with "_": the separator joins the prefix
	// (gg_colsum##SUF with SUF = _f32_f32: gg_colsum_, f32_f32).
	for _, gr := range groups {
		under := gr.tmpl
		for _, k := range gr.ks {
			under = under && strings.HasPrefix(k.name[len(gr.prefix):], "_")
		}
		if under {
			gr.prefix += "_"
		}
	}
	var b bytes.Buffer
	fmt.Fprintf(&b, "// Code generated by gen.go from %s. DO NOT EDIT.\n\npackage launch\n\n", name)
	usesCUDA := false
	for _, k := range ks {
		for _, p := range k.params {
			usesCUDA = usesCUDA || p.t.ptr
		}
	}
	for _, st := range g.structs {
		if st.file != name || (!st.used && !g.nested(st)) {
			continue // not emitted here
		}
		for _, f := range st.fields {
			usesCUDA = usesCUDA || f.t.ptr
		}
	}
	if usesCUDA {
		b.WriteString("import (\n\t\"unsafe\"\n\n\t\"gpukit/libgpu/cuda\"\n)\n\n")
	} else {
		b.WriteString("import \"unsafe\"\n\n")
	}
	// Structs the file's kernels take.
	var sts []*cstruct
	for _, st := range g.structs {
		if st.file == name {
			sts = append(sts, st)
		}
	}
	sort.Slice(sts, func(i, j int) bool { return sts[i].cname < sts[j].cname })
	for _, st := range sts {
		if !st.used && !g.nested(st) {
			continue
		}
		if err := g.claim(st.goName, "struct "+st.cname); err != nil {
			return nil, err
		}
		st.emitted = true
		if st.asserted != 0 && st.asserted != st.size {
			return nil, fmt.Errorf("struct %s: %d bytes by the C layout rules, %d by its static_assert", st.cname, st.size, st.asserted)
		}
		fmt.Fprintf(&b, "// %s is struct %s of %s (%d bytes, alignment %d).\ntype %s struct {\n", st.goName, st.cname, name, st.size, st.align, st.goName)
		// Go aligns to at most 8 bytes: a field or end that C aligns
		// further (a struct __align__(N), N > 8) gets explicit padding.
		var off, goOff int64
		pad := func(to int64) {
			if to > goOff {
				fmt.Fprintf(&b, "\t_ [%d]byte // C alignment\n", to-goOff)
				goOff = to
			}
		}
		for _, f := range st.fields {
			t := f.t.goType()
			if f.n > 0 {
				t = fmt.Sprintf("[%d]%s", f.n, t)
			}
			sz, al := f.t.size()
			if f.n > 0 {
				sz *= f.n
			}
			off = (off + al - 1) / al * al
			goOff = (goOff + min(al, 8) - 1) / min(al, 8) * min(al, 8)
			pad(off)
			fmt.Fprintf(&b, "\t%s %s // %s\n", f.goName, t, f.t.c)
			off += sz
			goOff += sz
		}
		goOff = (goOff + min(st.align, 8) - 1) / min(st.align, 8) * min(st.align, 8)
		pad(st.size)
		fmt.Fprintf(&b, "}\n\n// The Go layout is the C one: a difference does not compile.\nvar _ [%d]byte = [unsafe.Sizeof(%s{})]byte{}\n\n", st.size, st.goName)
	}
	for _, gr := range groups {
		if err := g.emit(&b, gr); err != nil {
			return nil, err
		}
		g.all = append(g.all, gr.ks...)
	}
	src, err := format.Source(b.Bytes())
	if err != nil {
		return nil, fmt.Errorf("gofmt of the output: %v\n%s", err, b.String())
	}
	return src, nil
}

// nested reports whether a struct other kernels' structs contain is st.
func (g *gen) nested(st *cstruct) bool { return g.nestedIn(st, map[*cstruct]bool{}) }

// nestedIn reports whether st is a field, at any depth, of a struct a
// kernel takes (a geometry inside a multi-tensor launch's per-tensor
// struct inside its arguments); seen guards against cycles.
func (g *gen) nestedIn(st *cstruct, seen map[*cstruct]bool) bool {
	if seen[st] {
		return false
	}
	seen[st] = true
	for _, o := range g.structs {
		for _, f := range o.fields {
			if f.t.st == st && (o.used || g.nestedIn(o, seen)) {
				return true
			}
		}
	}
	return false
}

func (g *gen) claim(goName, what string) error {
	if old, ok := g.goNames[goName]; ok {
		return fmt.Errorf("%s and %s are both %s in Go", old, what, goName)
	}
	g.goNames[goName] = what
	return nil
}

// dtypeSuffixes are the instance names of kernels written out once per
// dtype (count_above_f32, count_above_i32).
var dtypeSuffixes = []string{"_f32", "_bf16", "_f16", "_f64", "_i32"}

// dtypeTemplates makes templates of the kernels no macro pasted whose
// names differ only in trailing dtype suffixes (embed_fwd_f32_bf16,
// embed_fwd_bf16_f32, ...: embed_fwd_<inst>), where two or more share the
// stem and the Go signature.
func dtypeTemplates(ks []*kernel) {
	stem := func(name string) string {
		s := name
		for {
			cut := false
			for _, d := range dtypeSuffixes {
				if t, ok := strings.CutSuffix(s, d); ok && t != "" {
					s, cut = t, true
				}
			}
			if !cut {
				break
			}
		}
		if s == name {
			return ""
		}
		return s
	}
	count := map[string]int{}
	for _, k := range ks {
		if s := stem(k.name); !k.tmpl && s != "" {
			count[s+"\x00"+sig(k)]++
		}
	}
	for _, k := range ks {
		if s := stem(k.name); !k.tmpl && s != "" && count[s+"\x00"+sig(k)] >= 2 {
			k.tmpl, k.prefix = true, s
		}
	}
}

func sig(k *kernel) string {
	var s []string
	for _, p := range k.params {
		s = append(s, p.t.goType())
	}
	return strings.Join(s, ",")
}

func (g *gen) emit(b *bytes.Buffer, gr *group) error {
	kname := gr.goName + "Kernel"
	if err := g.claim(gr.goName, gr.file+" "+gr.prefix); err != nil {
		return err
	}
	if err := g.claim(kname, gr.file+" "+gr.prefix+" (its Kernel)"); err != nil {
		return err
	}
	k0 := gr.ks[0]
	// Parameters.
	var decl, args, nilChecks []string
	used := map[string]bool{}
	for n, p := range k0.params {
		pn := lowerCamel(p.cname)
		if pn == "" {
			pn = fmt.Sprintf("arg%d", n)
		}
		if goReserved[pn] || used[pn] {
			pn += "Arg"
		}
		for used[pn] {
			pn += "_"
		}
		used[pn] = true
		if p.t.st != nil {
			decl = append(decl, pn+" *"+p.t.st.goName)
			args = append(args, "unsafe.Pointer("+pn+")")
			nilChecks = append(nilChecks, pn)
		} else {
			decl = append(decl, pn+" "+p.t.goType())
			args = append(args, "unsafe.Pointer(&"+pn+")")
		}
	}
	// a T, b T → a, b T
	var merged []string
	var names []string
	for i, d := range decl {
		n, t, _ := strings.Cut(d, " ")
		names = append(names, n)
		if i+1 < len(decl) {
			if _, t2, _ := strings.Cut(decl[i+1], " "); t2 == t {
				continue
			}
		}
		merged = append(merged, strings.Join(names, ", ")+" "+t)
		names = nil
	}
	decl = merged
	if gr.tmpl {
		var insts []string
		for _, k := range gr.ks {
			insts = append(insts, strconv.Quote(strings.TrimPrefix(k.name, gr.prefix)))
		}
		fmt.Fprintf(b, "// %s launches %s<inst> of %s, inst one of %s:\n//\n//\t%s(%s)\n",
			gr.goName, gr.prefix, gr.file, strings.Join(insts, ", "), k0.name, k0.decl)
		fmt.Fprintf(b, "func %s(l Launcher, inst string, grid, block [3]uint32, smem uint32%s) error {\n",
			gr.goName, prefixComma(decl))
		fmt.Fprintf(b, "\tkn, kerr := %s(inst)\n\tif kerr != nil {\n\t\treturn kerr\n\t}\n", kname)
	} else {
		fmt.Fprintf(b, "// %s launches %s of %s:\n//\n//\t%s(%s)\n", gr.goName, k0.name, gr.file, k0.name, k0.decl)
		fmt.Fprintf(b, "func %s(l Launcher, grid, block [3]uint32, smem uint32%s) error {\n", gr.goName, prefixComma(decl))
		fmt.Fprintf(b, "\tkn := %s\n", kname)
	}
	for _, pn := range nilChecks {
		fmt.Fprintf(b, "\tif %s == nil {\n\t\treturn errNilArgs(kn)\n\t}\n", pn)
	}
	fmt.Fprintf(b, "\treturn l.Launch(kn, grid, block, smem%s)\n}\n\n", prefixComma(args))
	if gr.tmpl {
		fmt.Fprintf(b, "// %s is instance inst of %s<inst> (%s), for Prefetch.\nfunc %s(inst string) (Kernel, error) {\n\tswitch inst {\n",
			kname, gr.prefix, gr.goName, kname)
		for _, k := range gr.ks {
			fmt.Fprintf(b, "\tcase %q:\n\t\treturn Kernel{File: %q, Name: %q}, nil\n", strings.TrimPrefix(k.name, gr.prefix), gr.file, k.name)
		}
		fmt.Fprintf(b, "\t}\n\treturn Kernel{}, errNoInstance(%q, %q, inst)\n}\n\n", gr.file, gr.prefix)
	} else {
		fmt.Fprintf(b, "// %s is %s of %s (%s), for Prefetch.\nvar %s = Kernel{File: %q, Name: %q}\n\n", kname, k0.name, gr.file, gr.goName, kname, gr.file, k0.name)
	}
	return nil
}

func prefixComma(s []string) string {
	if len(s) == 0 {
		return ""
	}
	return ", " + strings.Join(s, ", ")
}

// index lists every kernel instance.
func (g *gen) index() []byte {
	var b bytes.Buffer
	b.WriteString("// Code generated by gen.go. DO NOT EDIT.\n\npackage launch\n\n")
	b.WriteString("// all is every kernel instance of libgpu/kernels/*.cu, by file and name.\nvar all = []Kernel{\n")
	for _, k := range g.all {
		fmt.Fprintf(&b, "\t{File: %q, Name: %q},\n", k.file, k.name)
	}
	b.WriteString("}\n")
	src, err := format.Source(b.Bytes())
	if err != nil {
		fail("gen: gofmt of the index: %v", err)
	}
	return src
}
