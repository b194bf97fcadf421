package ipc

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"unicode/utf8"

	"golang.org/x/sys/unix"
)

// envelope is a request frame with op written as the given msgpack bytes.
func envelope(id byte, op []byte) []byte {
	b := []byte{0x84, 0xa1, 'v', Version, 0xa1, 't', byte(TypeRequest), 0xa2, 'i', 'd', id, 0xa2, 'o', 'p'}
	return append(b, op...)
}

// Issue 22, item 7: op must be a msgpack str of valid UTF-8 (msgpack's
// decoder would read a bin into the string), in the fast path and the
// reflection fallback alike.
func TestDecodeRefusesOpNotUTF8Str(t *testing.T) {
	ok := envelope(1, []byte{0xa5, 'h', 'e', 'l', 'l', 'o'})
	if m, err := Decode(ok); err != nil || m.Op != "hello" {
		t.Fatalf("str op: %+v %v", m, err)
	}
	cases := map[string][]byte{
		"bin op":                 envelope(1, []byte{0xc4, 5, 'h', 'e', 'l', 'l', 'o'}),
		"str op, invalid UTF-8":  envelope(1, []byte{0xa3, 'a', 0xff, 'b'}),
		"str8 op, invalid UTF-8": envelope(1, []byte{0xd9, 2, 0xc3, 0x28}),
		// A key the fast parser leaves to msgpack (a negative flow, then
		// a bin op): the fallback must refuse the op too.
		"bin op, fallback": append([]byte{0x85, 0xa4, 'f', 'l', 'o', 'w', 0xc0, 0xa1, 'v', Version, 0xa1, 't', 1, 0xa2, 'i', 'd', 1, 0xa2, 'o', 'p'}, 0xc4, 1, 'x'),
		"bad UTF-8 and version": func() []byte {
			b := envelope(1, []byte{0xa2, 0xff, 0xfe})
			b[3] = 9
			return b
		}(),
	}
	for name, b := range cases {
		if _, err := Decode(b); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: %v, want malformed", name, err)
		}
	}
}

// quoter answers every request with an error that quotes its body's bytes
// as they came, invalid UTF-8 included.
type quoter struct{}

func (quoter) Connect(*Conn) (Session, error) { return quoter{}, nil }
func (quoter) Close()                         {}
func (quoter) Handle(_ context.Context, m *Message, _ []int) (any, []int, error) {
	var s string
	UnmarshalBody(m.Body, &s)
	return nil, nil, fmt.Errorf("%w: no such thing as %s", ErrBadRequest, s)
}

// Issue 22, item 7: nothing the server sends is invalid UTF-8, whatever
// the peer sent (a strict decoder, Python's, could not read the reply),
// and a frame with a bin op is answered as malformed and closed.
func TestRepliesAreUTF8(t *testing.T) {
	path := startServer(t, quoter{})
	c, err := Dial(path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	body := []byte{0xa4, 'a', 0xff, 0xfe, 'b'} // a str of invalid UTF-8
	if err := c.Send(&Message{Version: Version, Type: TypeRequest, ID: 7, Op: "quote", Body: body}); err != nil {
		t.Fatal(err)
	}
	m, _, err := c.Recv()
	if err != nil || m.ID != 7 || m.Err == nil {
		t.Fatalf("reply: %+v %v", m, err)
	}
	if !utf8.ValidString(m.Err.Message) || !strings.Contains(m.Err.Message, "a\uFFFD") {
		t.Fatalf("error message %q", m.Err.Message)
	}
	if err := c.SendRaw(envelope(8, []byte{0xc4, 3, 'b', 'i', 'n'})); err != nil {
		t.Fatal(err)
	}
	m, _, err = c.Recv()
	if err != nil || m.ID != 0 || m.Err == nil || m.Err.Code != "malformed" || !utf8.ValidString(m.Op) {
		t.Fatalf("bin op: %+v %v", m, err)
	}
	if _, _, err := c.Recv(); err == nil {
		t.Fatal("the connection stayed open after a malformed frame")
	}
	if w := ToWire(errors.New("x\xffy")); !utf8.ValidString(w.Message) {
		t.Fatalf("ToWire kept invalid UTF-8: %q", w.Message)
	}
	if got := echoOp(strings.Repeat("\xff", 200)); !utf8.ValidString(got) || len(got) > MaxOp {
		t.Fatalf("echoOp: %q", got)
	}
}

// Issue 22, item 5: a request whose fds do not arrive (more than MaxFDs,
// or the daemon out of descriptors: MSG_CTRUNC either way) fails alone,
// with its id; the connection goes on.
func TestLostFDsFailOneRequest(t *testing.T) {
	path := startServer(t, &echo{})
	c, err := Dial(path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fd := memfd(t, []byte("x"))
	defer unix.Close(fd)
	fds := make([]int, MaxFDs+4)
	for i := range fds {
		fds[i] = fd
	}
	b, _ := Encode(&Message{Version: Version, Type: TypeRequest, ID: 5, Op: "echo"})
	if _, _, err := c.uc.WriteMsgUnix(b, unix.UnixRights(fds...), nil); err != nil {
		t.Fatal(err)
	}
	m, _, err := c.Recv()
	if err != nil || m.ID != 5 || m.Err == nil || m.Err.Code != "too_many_fds" || !strings.Contains(m.Err.Message, "out of file descriptors") {
		t.Fatalf("reply: %+v %v", m, err)
	}
	cl := NewClient(c)
	var got string
	if _, err := cl.Call(context.Background(), "echo", "still", &got); err != nil || got != "still" {
		t.Fatalf("after the lost fds: %q %v", got, err)
	}
}

func TestAdmission(t *testing.T) {
	self := uint32(os.Geteuid())
	groups := SupplementaryGroups(int32(os.Getpid()))
	if groups == nil {
		t.Fatal("no Groups: line for this process")
	}
	other := uint32(1<<31 + 5)
	cases := []struct {
		a    Admission
		cred Cred
		ok   bool
	}{
		{Admission{Anyone: true}, Cred{UID: other}, true},
		{Admission{Self: self}, Cred{UID: self}, true},
		{Admission{Self: self}, Cred{UID: other}, false},
		{Admission{Self: other + 1}, Cred{UID: 0}, false},
		{Admission{Self: other + 1, Root: true}, Cred{UID: 0}, true},
		{Admission{Self: self, UIDs: []uint32{other}}, Cred{UID: other}, true},
		{Admission{Self: self, GIDs: []uint32{77}}, Cred{UID: other, GID: 77}, true},
		{Admission{Self: self, GIDs: []uint32{77}}, Cred{UID: other, GID: 78, PID: int32(os.Getpid())}, false},
	}
	if len(groups) > 0 {
		cases = append(cases, struct {
			a    Admission
			cred Cred
			ok   bool
		}{Admission{Self: self, GIDs: []uint32{groups[0]}}, Cred{UID: other, GID: groups[0] + 1, PID: int32(os.Getpid())}, true})
	}
	for i, c := range cases {
		err := c.a.Check(c.cred)
		if (err == nil) != c.ok || (err != nil && !errors.Is(err, ErrPermission)) {
			t.Errorf("case %d %+v %+v: %v", i, c.a, c.cred, err)
		}
	}
}

// Listener tells two connections to one daemon from a connection to
// another, and File hands a connection over.
func TestListenerIdentity(t *testing.T) {
	a := startServer(t, &echo{})
	b := startServer(t, &echo{})
	ca1, _ := Dial(a)
	ca2, _ := Dial(a)
	cb, _ := Dial(b)
	defer ca1.Close()
	defer ca2.Close()
	defer cb.Close()
	c1, addr1, err := ca1.Listener()
	if err != nil {
		t.Fatal(err)
	}
	c2, addr2, _ := ca2.Listener()
	c3, addr3, _ := cb.Listener()
	if c1 != c2 || addr1 != addr2 || addr1 != a {
		t.Fatalf("one daemon: %+v %q, %+v %q (listening on %q)", c1, addr1, c2, addr2, a)
	}
	if c1 == c3 && addr1 == addr3 {
		t.Fatal("two daemons look the same")
	}
	f, err := ca1.File()
	if err != nil {
		t.Fatal(err)
	}
	fd, err := unix.Dup(int(f.Fd()))
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	moved, err := FileConn(fd)
	if err != nil {
		t.Fatal(err)
	}
	defer moved.Close()
	if _, addr, _ := moved.Listener(); addr != a {
		t.Fatalf("handed over: %q", addr)
	}
	x, y, _ := Pair()
	defer x.Close()
	defer y.Close()
	if _, _, err := x.Listener(); err == nil {
		t.Fatal("a socketpair has a listener")
	}
	if x.HungUp() {
		t.Fatal("hung up before the close")
	}
	y.Close()
	if !x.HungUp() {
		t.Fatal("not hung up after the close")
	}
}
