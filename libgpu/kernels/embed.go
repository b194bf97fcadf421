package kernels

import (
	"embed"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
)

// SourceDirEnv names a directory whose *.cu and *.cuh files replace the
// embedded ones of the same name (a kernel developer's knob: a changed
// kernel is timed without rebuilding the Go binary, as long as its
// arguments are unchanged). Files not found there come from the embedded
// set. The compiled images are cached by content, so a replaced source
// never reuses the embedded one's image.
const SourceDirEnv = "GPUKIT_KERNEL_SRC"

// readSource reads the embedded kernel source name, or its replacement in
// $GPUKIT_KERNEL_SRC when that holds one. It fails with ErrNoSource when
// nothing of that name is embedded (a replacement alone is not read).
func readSource(name string) ([]byte, error) {
	b, err := embedded.ReadFile(name)
	if err != nil {
		return nil, fmt.Errorf("%w: %q", ErrNoSource, name)
	}
	if dir := os.Getenv(SourceDirEnv); dir != "" {
		o, err := os.ReadFile(filepath.Join(dir, name))
		if err == nil {
			return o, nil
		}
		if !os.IsNotExist(err) {
			return nil, fmt.Errorf("kernels: %s=%s: %w", SourceDirEnv, dir, err)
		}
	}
	return b, nil
}

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
// ErrNoSource when no such .cu file is embedded. A file of that name in
// $GPUKIT_KERNEL_SRC (SourceDirEnv) replaces the embedded one, and so do
// the headers there.
func Embedded(name string) (Source, error) {
	if path.Ext(name) != ".cu" || strings.Contains(name, "/") {
		return Source{}, fmt.Errorf("%w: %q", ErrNoSource, name)
	}
	b, err := readSource(name)
	if err != nil {
		return Source{}, err
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
		b, err := readSource(e.Name())
		if err == nil {
			h[e.Name()] = string(b)
		}
	}
	return h
}
