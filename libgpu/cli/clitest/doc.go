// Package clitest has testscript commands for checking a gpukit tool's
// command line against TOOLS.md: exit statuses and JSON lines. Each tool's
// script test adds Cmds to its testscript.Params.
package clitest
