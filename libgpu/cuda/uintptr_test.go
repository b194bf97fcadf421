package cuda

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"
)

// TestPointersReachCOnlyInCallArguments holds the repository to the
// package doc's rule for memory handed to C: uintptr(unsafe.Pointer(x))
// is written only in the argument list of a call of a //go:uintptrescapes
// function (which puts x on the heap and keeps it alive for the call: the
// repository's own, found by their directive, and the syscall packages').
// A conversion anywhere else must say on its line, in a comment, why the
// memory cannot move (pinned, not Go memory, arithmetic only). On a GPU
// machine (2026-11-29) a tensor map encoded into a buffer whose address
// was passed through a plain func value came back as zeros: the
// goroutine's stack had grown and moved the buffer before the driver wrote
// it.
func TestPointersReachCOnlyInCallArguments(t *testing.T) {
	root := filepath.Join("..", "..")
	fset := token.NewFileSet()
	var files []*ast.File
	escapes := map[string]bool{"Syscall": true, "Syscall6": true, "RawSyscall": true, "RawSyscall6": true, "SyscallN": true}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if path != root && (strings.HasPrefix(name, ".") || name == "testdata" || name == "build" || name == "vendor") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ParseComments)
		if err != nil {
			return err
		}
		files = append(files, f)
		for _, decl := range f.Decls {
			if fd, ok := decl.(*ast.FuncDecl); ok && fd.Doc != nil && strings.Contains(fd.Doc.Text()+directives(fd.Doc), "go:uintptrescapes") {
				escapes[fd.Name.Name] = true
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if !escapes["cu"] {
		t.Fatal("found no //go:uintptrescapes on libgpu/cuda's proc.cu: the scan is broken")
	}
	var bad []string
	for _, f := range files {
		commented := map[int]bool{}
		for _, g := range f.Comments {
			for _, c := range g.List {
				commented[fset.Position(c.Pos()).Line] = true
			}
		}
		inArgs := map[ast.Expr]bool{}
		ast.Inspect(f, func(n ast.Node) bool {
			if call, ok := n.(*ast.CallExpr); ok && escapes[funcName(call.Fun)] {
				for _, a := range call.Args {
					inArgs[a] = true
				}
			}
			return true
		})
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok || !isIdent(call.Fun, "uintptr") || len(call.Args) != 1 {
				return true
			}
			inner, ok := call.Args[0].(*ast.CallExpr)
			if !ok || !isSel(inner.Fun, "unsafe", "Pointer") {
				return true
			}
			if pos := fset.Position(call.Pos()); !inArgs[call] && !commented[pos.Line] {
				bad = append(bad, pos.String())
			}
			return true
		})
	}
	for _, b := range bad {
		t.Errorf("%s: uintptr(unsafe.Pointer(...)) not in the argument list of a //go:uintptrescapes call, with no comment saying why the memory cannot move", b)
	}
}

func isIdent(e ast.Expr, name string) bool {
	id, ok := e.(*ast.Ident)
	return ok && id.Name == name
}

func isSel(e ast.Expr, pkg, name string) bool {
	s, ok := e.(*ast.SelectorExpr)
	return ok && isIdent(s.X, pkg) && s.Sel.Name == name
}

// funcName is the called function's or method's name ("" for other
// callees).
func funcName(e ast.Expr) string {
	switch f := e.(type) {
	case *ast.Ident:
		return f.Name
	case *ast.SelectorExpr:
		return f.Sel.Name
	}
	return ""
}

// directives returns a doc comment's //go: lines (CommentGroup.Text drops
// them).
func directives(g *ast.CommentGroup) string {
	var b strings.Builder
	for _, c := range g.List {
		if strings.HasPrefix(c.Text, "//go:") {
			b.WriteString(c.Text)
		}
	}
	return b.String()
}
