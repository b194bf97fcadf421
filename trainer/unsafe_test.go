package main

import "unsafe"

// unsafePointer is &b as an unsafe.Pointer (inotify events are read from
// a byte buffer).
func unsafePointer(b *byte) unsafe.Pointer { return unsafe.Pointer(b) }
