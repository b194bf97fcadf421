package cli

import (
	"runtime"
	"runtime/debug"
)

// version is set at link time by make build:
//
//	go build -ldflags "-X gpukit/libgpu/cli.version=$(git describe --tags --always --dirty)"
var version string

// Version is the tool's version as --version prints it after the tool's
// name: the -ldflags version (make build and make install set it), else
// the main module's version from the build info, else "devel" with the VCS
// revision when the build recorded one; then the Go version and platform,
// e.g. "v0.3.1 (go1.26.8 linux/amd64)".
func Version() string {
	return versionString() + " (" + runtime.Version() + " " + runtime.GOOS + "/" + runtime.GOARCH + ")"
}

func versionString() string {
	if version != "" {
		return version
	}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "devel"
	}
	if v := bi.Main.Version; v != "" && v != "(devel)" {
		return v
	}
	var rev string
	dirty := false
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	v := "devel"
	if rev != "" {
		v += "-" + rev[:min(12, len(rev))]
	}
	if dirty {
		v += "-dirty"
	}
	return v
}
