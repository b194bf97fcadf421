package app

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
)

var includeRE = regexp.MustCompile(`^\s*#\s*include\s*["<]([^">]+)[">]`)

// resolveIncludes finds the files a source includes (#include "x" or <x>)
// in the source's directory and the -I directories, recursively, and returns
// them as NVRTC headers keyed by the name as written. Passing them as
// headers puts their contents in the cache key, so editing a header
// recompiles. Includes not found there (toolkit headers) are left to NVRTC.
func resolveIncludes(code []byte, dir string, includeDirs []string) (map[string]string, error) {
	headers := map[string]string{}
	var walk func(code []byte, dir string, depth int) error
	walk = func(code []byte, dir string, depth int) error {
		if depth > 32 {
			return fmt.Errorf("build: includes nested more than 32 deep")
		}
		sc := bufio.NewScanner(bytes.NewReader(code))
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			m := includeRE.FindSubmatch(sc.Bytes())
			if m == nil {
				continue
			}
			name := string(m[1])
			if _, done := headers[name]; done {
				continue
			}
			for _, d := range append([]string{dir}, includeDirs...) {
				p := filepath.Join(d, name)
				b, err := os.ReadFile(p)
				if err != nil {
					continue
				}
				headers[name] = string(b)
				if err := walk(b, filepath.Dir(p), depth+1); err != nil {
					return err
				}
				break
			}
		}
		return nil
	}
	if err := walk(code, dir, 0); err != nil {
		return nil, err
	}
	return headers, nil
}

// toolkitInclude is the CUDA toolkit's include directory when one is found:
// DIR/../include for each DIR of GPUKIT_CUDA_PATH (a lib directory), else
// /usr/local/cuda/include. NVRTC does not search it by itself; it is needed
// only by sources that include toolkit headers (cuda_bf16.h, ...). libgpu's
// own kernels include none.
func toolkitInclude() string {
	var cands []string
	for _, d := range filepath.SplitList(os.Getenv("GPUKIT_CUDA_PATH")) {
		if d != "" {
			cands = append(cands, filepath.Join(d, "..", "include"))
		}
	}
	cands = append(cands, "/usr/local/cuda/include")
	for _, d := range cands {
		if st, err := os.Stat(filepath.Join(d, "cuda_runtime.h")); err == nil && !st.IsDir() {
			return filepath.Clean(d)
		}
	}
	return ""
}
