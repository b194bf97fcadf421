package ipc

import "os"

func fdFile(fd int) *os.File { return os.NewFile(uintptr(fd), "ipc-socket") }
