package main

import (
	"os"
	"testing"

	"github.com/rogpeppe/go-internal/testscript"

	kit "gpukit/libgpu/cli"
	"gpukit/libgpu/cli/clitest"
	"gpukit/optimizer/internal/app"
)

func TestMain(m *testing.M) {
	testscript.Main(m, map[string]func(){
		"optimizer": func() { os.Exit(kit.Main(app.New(), os.Args)) },
	})
}

// TestScripts runs testdata/script/*.txtar against the real optimizer command
// line (status, jsonlines: see libgpu/cli/clitest).
func TestScripts(t *testing.T) {
	testscript.Run(t, testscript.Params{Dir: "testdata/script", Cmds: clitest.Cmds()})
}
