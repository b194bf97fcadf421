package ipctest

import (
	"bytes"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

// ReflectEncode is what msgpack's reflection encoder writes for v, with
// compact integers as libgpu/ipc uses it: the bytes a hand-written body
// codec (ipc.BodyAppender) must reproduce.
func ReflectEncode(t testing.TB, v any) []byte {
	t.Helper()
	var buf bytes.Buffer
	e := msgpack.NewEncoder(&buf)
	e.UseCompactInts(true)
	if err := e.Encode(v); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}
