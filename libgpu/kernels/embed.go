package kernels

import (
	"embed"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strings"
)

// embedded holds every kernel source of this directory. The pattern needs at
// least one match of each: common.cuh and selftest.cu guarantee that.
//
//go:embed *.cu *.cuh
var embedded embed.FS

// Sources lists the file names of the embedded kernel sources (*.cu), sorted.
func Sources() []string {
	var names []string
	entries, _ := fs.ReadDir(embedded, ".")
	for _, e := range entries {
		if !e.IsDir() && path.Ext(e.Name()) == ".cu" {
			names = append(names, e.Name())
		}
	}
	sort.Strings(names)
	return names
}

// Embedded returns the embedded source named name ("selftest.cu") with every
// embedded header (*.cuh) attached, ready for Compiler.Compile. It fails with
// ErrNoSource when no such .cu file is embedded.
func Embedded(name string) (Source, error) {
	if path.Ext(name) != ".cu" || strings.Contains(name, "/") {
		return Source{}, fmt.Errorf("%w: %q", ErrNoSource, name)
	}
	b, err := embedded.ReadFile(name)
	if err != nil {
		return Source{}, fmt.Errorf("%w: %q", ErrNoSource, name)
	}
	return Source{Name: name, Code: b, Headers: EmbeddedHeaders()}, nil
}

// EmbeddedHeaders returns the embedded *.cuh files, keyed by file name, so a
// kernel can #include "common.cuh" with no include path.
func EmbeddedHeaders() map[string]string {
	h := map[string]string{}
	entries, _ := fs.ReadDir(embedded, ".")
	for _, e := range entries {
		if e.IsDir() || path.Ext(e.Name()) != ".cuh" {
			continue
		}
		b, err := embedded.ReadFile(e.Name())
		if err == nil {
			h[e.Name()] = string(b)
		}
	}
	return h
}
