package main

import (
	"os"
	"testing"

	"github.com/rogpeppe/go-internal/testscript"

	"gpukit/libgpu/cli/clitest"
)

// TestScripts runs testdata/script/*.txtar with the tracer binary TestMain
// built first in PATH (status, jsonlines, validjson: libgpu/cli/clitest).
func TestScripts(t *testing.T) {
	testscript.Run(t, testscript.Params{
		Dir:  "testdata/script",
		Cmds: clitest.Cmds(),
		Setup: func(e *testscript.Env) error {
			e.Setenv("PATH", binDir+string(os.PathListSeparator)+e.Getenv("PATH"))
			e.Setenv("GPUKIT_TRACE", "")
			return nil
		},
	})
}
