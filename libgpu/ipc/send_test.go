package ipc

import (
	"bytes"
	"errors"
	"io"
	"testing"

	"golang.org/x/sys/unix"
)

// TestSendFull: a sender whose peer reads nothing fills the socket and
// then waits for room instead of failing; once the peer reads, every
// message arrives whole and in order.
func TestSendFull(t *testing.T) {
	a, b := pair(t)
	const n = 64 // far more than a socket buffer holds at MaxMessage/2 each
	msgs := make([][]byte, n)
	for i := range msgs {
		msgs[i] = bytes.Repeat([]byte{byte(i)}, MaxMessage/2)
	}
	sent := make(chan error, 1)
	go func() {
		for i, body := range msgs {
			raw, _ := MarshalBody(body)
			if err := a.Send(&Message{Version: Version, Type: TypeRequest, ID: uint64(i + 1), Op: "put", Body: raw}); err != nil {
				sent <- err
				a.CloseWrite() // the reader sees the end, not a hang
				return
			}
		}
		sent <- nil
	}()
	for i, want := range msgs {
		m, _, err := b.Recv()
		if err != nil {
			select {
			case serr := <-sent:
				t.Fatalf("message %d: %v; the sender: %v", i, err, serr)
			default:
			}
			t.Fatalf("message %d: %v", i, err)
		}
		var got []byte
		if err := UnmarshalBody(m.Body, &got); err != nil || m.ID != uint64(i+1) || !bytes.Equal(got, want) {
			t.Fatalf("message %d (id %d) changed in transit (%v)", i, m.ID, err)
		}
	}
	if err := <-sent; err != nil {
		t.Fatalf("send into a full socket: %v", err)
	}
}

// TestSendClosed: sending to a peer that has closed, or on a connection
// closed here, fails with ErrClosed (and no SIGPIPE ends the test).
func TestSendClosed(t *testing.T) {
	a, b := pair(t)
	b.Close()
	m := &Message{Version: Version, Type: TypeRequest, ID: 1, Op: "ping"}
	if err := a.Send(m); !errors.Is(err, ErrClosed) {
		t.Fatalf("send to a closed peer: %v, want ErrClosed", err)
	}
	c, _ := pair(t)
	c.Close()
	if err := c.Send(m); !errors.Is(err, ErrClosed) {
		t.Fatalf("send on a closed connection: %v, want ErrClosed", err)
	}
}

// TestSendFDsAlone: a message of fds and no bytes carries one zero byte,
// as the net package sends it, so no reader (a Python client's recvmsg,
// say) takes it for the end of the connection; this package's Recv reads
// it as malformed (no envelope) and closes its fds, and the connection
// goes on.
func TestSendFDsAlone(t *testing.T) {
	a, b := pair(t)
	fd := memfd(t, []byte("x"))
	defer unix.Close(fd)
	for range 2 {
		if err := a.SendRaw(nil, fd); err != nil {
			t.Fatal(err)
		}
	}
	buf, oob := make([]byte, 16), make([]byte, unix.CmsgSpace(4))
	n, oobn, _, _, err := b.uc.ReadMsgUnix(buf, oob)
	if err != nil || n != 1 || buf[0] != 0 || oobn == 0 {
		t.Fatalf("fds alone arrived as %d bytes %x and %d of control (%v), want one zero byte and the fd", n, buf[:n], oobn, err)
	}
	got, err := parseFDs(oob[:oobn])
	if err != nil || len(got) != 1 {
		t.Fatalf("fds %v %v", got, err)
	}
	closeFDs(got)
	if _, _, err := b.Recv(); !errors.Is(err, ErrMalformed) {
		t.Fatalf("fds alone read as %v, want ErrMalformed", err)
	}
	if err := a.Send(&Message{Version: Version, Type: TypeRequest, ID: 2, Op: "ping"}); err != nil {
		t.Fatal(err)
	}
	if m, fds, err := b.Recv(); err != nil || m.ID != 2 || len(fds) != 0 {
		t.Fatalf("after fds alone: %+v %v %v", m, fds, err)
	}
	a.CloseWrite()
	if _, _, err := b.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("after close: %v", err)
	}
}
