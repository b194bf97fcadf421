package dist

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"
)

// ErrRendezvous: the ranks could not meet: rank 0 unreachable, a rank
// missing at the deadline, or a peer that contradicts this one.
var ErrRendezvous = errors.New("dist: rendezvous failed")

// DefaultRendezvousTimeout bounds a rendezvous when Rendezvous.Timeout is
// zero (torch.distributed's TCPStore waits 300 s by default too).
const DefaultRendezvousTimeout = 5 * time.Minute

// The wire protocol, version 1 (all integers big-endian):
//
//	hello, rank r → rank 0: "GPUKITRV" | u16 version | u32 rank | u32 world size | u16 n | tag (n bytes)
//	reply, rank 0 → rank r: u8 status (0: ok, 1: refused) | u32 n | payload or reason (n bytes, ≤ 1 MiB)
//
// Rank 0 replies to every rank once all of them have said hello, then
// closes the connections.
const (
	rvMagic   = "GPUKITRV"
	rvVersion = 1
	rvMaxData = 1 << 20
	// rvHelloWait bounds how long rank 0 waits for a connection's hello
	// before taking it for a stray (a port scanner, a health check).
	rvHelloWait = 10 * time.Second
)

// Rendezvous hands one payload (the NCCL unique id) from rank 0 to every
// other rank of World over TCP: rank 0 listens on World.RendezvousPort
// (MASTER_PORT), the others dial World.MasterAddr with retries until rank 0
// is up. Every rank learns of a rank that is missing or contradicts the
// others (another world size, a duplicate rank, another tag) by an error
// naming it, within Timeout, rather than by a hang.
type Rendezvous struct {
	World World
	// Timeout bounds the whole rendezvous (DefaultRendezvousTimeout when
	// zero); a context deadline that comes sooner wins.
	Timeout time.Duration
	// Listener, for rank 0, is accepted on instead of listening on
	// RendezvousPort (tests; a socket handed down by a launcher). Share
	// closes it.
	Listener net.Listener
	// Logf, when set, receives progress notes (rank 0 waiting, a stray
	// connection dropped, a rank retrying).
	Logf func(format string, args ...any)
}

func (r *Rendezvous) logf(format string, args ...any) {
	if r.Logf != nil {
		r.Logf(format, args...)
	}
}

// Share runs the rendezvous. tag names what is shared ("nccl"): ranks that
// disagree on it fail. On rank 0, payload makes the bytes (at most 1 MiB)
// once, before any rank is answered; other ranks do not call it. Every
// rank returns the same bytes. With one rank, Share returns payload()
// without touching the network.
func (r *Rendezvous) Share(ctx context.Context, tag string, payload func() ([]byte, error)) ([]byte, error) {
	w := r.World
	if w.Size <= 1 {
		if r.Listener != nil {
			r.Listener.Close()
		}
		return payload()
	}
	if w.Rank < 0 || w.Rank >= w.Size {
		return nil, fmt.Errorf("%w: rank %d of %d", ErrRendezvous, w.Rank, w.Size)
	}
	if len(tag) > 1024 {
		return nil, fmt.Errorf("%w: tag of %d bytes", ErrRendezvous, len(tag))
	}
	timeout := r.Timeout
	if timeout <= 0 {
		timeout = DefaultRendezvousTimeout
	}
	if w.Rank == 0 {
		ctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		return r.serve(ctx, tag, payload, timeout)
	}
	return r.join(ctx, tag, timeout)
}

// listenAddr is where rank 0 listens: the master address itself when it
// is a loopback address (a job on one machine stays off the network), all
// interfaces otherwise (MASTER_ADDR may be a name for an interface this
// machine does not know by that name).
func (w World) listenAddr() string {
	port := strconv.Itoa(w.RendezvousPort)
	if ip := net.ParseIP(w.MasterAddr); ip != nil && ip.IsLoopback() || w.MasterAddr == "localhost" {
		return net.JoinHostPort(w.MasterAddr, port)
	}
	return ":" + port
}

// dialAddr is where the other ranks reach rank 0.
func (w World) dialAddr() string {
	return net.JoinHostPort(w.MasterAddr, strconv.Itoa(w.RendezvousPort))
}

type hello struct {
	rank, size int
	conn       net.Conn
	err        error // a peer that broke the protocol's rules (fatal)
	stray      error // not a gpukit rank (dropped)
}

func (r *Rendezvous) serve(ctx context.Context, tag string, payload func() ([]byte, error), timeout time.Duration) ([]byte, error) {
	w := r.World
	ln := r.Listener
	if ln == nil {
		var lc net.ListenConfig
		var err error
		if ln, err = lc.Listen(ctx, "tcp", w.listenAddr()); err != nil {
			return nil, fmt.Errorf("%w: rank 0 cannot listen on %s: %v (another job on MASTER_PORT %d? choose another MASTER_PORT or set %s)",
				ErrRendezvous, w.listenAddr(), err, w.MasterPort, EnvRendezvousPort)
		}
	}
	where := ln.Addr().String()
	defer ln.Close()
	done := make(chan struct{}) // closed when serve returns: the goroutines below give up
	defer close(done)
	// A rank 0 that cannot make the payload still answers every rank that
	// comes, with the reason, so that they fail with it rather than wait.
	data, perr := payload()
	if perr == nil && len(data) > rvMaxData {
		perr = fmt.Errorf("%w: payload of %d bytes (at most %d)", ErrRendezvous, len(data), rvMaxData)
	}
	if perr != nil {
		r.logf("rendezvous: rank 0 cannot make the %s id (%v); telling the %d other ranks", tag, perr, w.Size-1)
	} else {
		r.logf("rendezvous: rank 0 waiting for %d ranks on %s", w.Size-1, where)
	}

	conns := make(chan net.Conn)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				close(conns)
				return
			}
			select {
			case conns <- c:
			case <-done:
				c.Close()
			}
		}
	}()
	hellos := make(chan hello)
	joined := map[int]net.Conn{}
	told := map[int]bool{} // ranks told that rank 0 has no payload
	var handshaking []net.Conn
	fail := func(reason error) ([]byte, error) {
		for _, c := range joined {
			reply(c, 1, []byte("rank 0: "+reason.Error()))
		}
		for _, c := range handshaking {
			c.Close()
		}
		return nil, reason
	}
	defer func() {
		for _, c := range joined {
			c.Close()
		}
	}()
	for len(joined) < w.Size-1 || perr != nil {
		select {
		case c, ok := <-conns:
			if !ok {
				return fail(fmt.Errorf("%w: rank 0 stopped accepting on %s", ErrRendezvous, where))
			}
			handshaking = append(handshaking, c)
			go func() {
				select {
				case hellos <- readHello(c, w, tag):
				case <-done:
					c.Close()
				}
			}()
		case h := <-hellos:
			handshaking = slices.DeleteFunc(handshaking, func(c net.Conn) bool { return c == h.conn })
			switch {
			case h.stray != nil:
				r.logf("rendezvous: dropped a connection from %s: %v", h.conn.RemoteAddr(), h.stray)
				h.conn.Close()
			case h.err != nil:
				reply(h.conn, 1, []byte("rank 0: "+h.err.Error()))
				h.conn.Close()
				return fail(h.err)
			case joined[h.rank] != nil || told[h.rank]:
				err := fmt.Errorf("%w: two processes claim rank %d (the second from %s): is RANK duplicated, or is another job using MASTER_PORT %d?",
					ErrRendezvous, h.rank, h.conn.RemoteAddr(), w.MasterPort)
				reply(h.conn, 1, []byte("rank 0: "+err.Error()))
				h.conn.Close()
				return fail(err)
			case perr != nil:
				reply(h.conn, 1, []byte("rank 0 cannot make the "+tag+" id: "+perr.Error()))
				h.conn.Close()
				told[h.rank] = true
				if len(told) == w.Size-1 {
					return nil, perr
				}
			default:
				joined[h.rank] = h.conn
			}
		case <-ctx.Done():
			if perr != nil {
				return fail(perr)
			}
			var missing []string
			for i := 1; i < w.Size; i++ {
				if joined[i] == nil {
					missing = append(missing, strconv.Itoa(i))
				}
			}
			what := "rank " + missing[0]
			if len(missing) > 1 {
				what = "ranks " + strings.Join(missing, ", ")
			}
			return fail(fmt.Errorf("%w: %s of %d did not join rank 0 on %s within %v", ErrRendezvous, what, w.Size, where, timeout))
		}
	}
	var errs []error
	for rank, c := range joined {
		if err := reply(c, 0, data); err != nil {
			errs = append(errs, fmt.Errorf("%w: rank %d went away before it got the %s id: %v", ErrRendezvous, rank, tag, err))
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	r.logf("rendezvous: rank 0 sent the %s id to %d ranks", tag, w.Size-1)
	return data, nil
}

// readHello reads and checks one connection's hello.
func readHello(c net.Conn, w World, tag string) hello {
	h := hello{conn: c}
	c.SetReadDeadline(time.Now().Add(rvHelloWait))
	br := bufio.NewReader(c)
	var head [8 + 2 + 4 + 4 + 2]byte
	if _, err := io.ReadFull(br, head[:]); err != nil {
		h.stray = fmt.Errorf("no hello: %v", err)
		return h
	}
	if string(head[:8]) != rvMagic {
		h.stray = fmt.Errorf("not a gpukit rank (it sent %q)", head[:8])
		return h
	}
	ver := binary.BigEndian.Uint16(head[8:])
	h.rank = int(binary.BigEndian.Uint32(head[10:]))
	h.size = int(binary.BigEndian.Uint32(head[14:]))
	tb := make([]byte, binary.BigEndian.Uint16(head[18:]))
	if _, err := io.ReadFull(br, tb); err != nil {
		h.stray = fmt.Errorf("hello cut short: %v", err)
		return h
	}
	c.SetReadDeadline(time.Time{})
	from := c.RemoteAddr()
	switch {
	case ver != rvVersion:
		h.err = fmt.Errorf("%w: the rank at %s speaks rendezvous protocol %d, rank 0 speaks %d (different gpukit versions?)",
			ErrRendezvous, from, ver, rvVersion)
	case h.size != w.Size:
		h.err = fmt.Errorf("%w: rank %d at %s says the world has %d ranks, rank 0 says %d (WORLD_SIZE differs between ranks)",
			ErrRendezvous, h.rank, from, h.size, w.Size)
	case h.rank <= 0 || h.rank >= w.Size:
		h.err = fmt.Errorf("%w: the peer at %s says it is rank %d of %d (rank 0 is this process)", ErrRendezvous, from, h.rank, h.size)
	case string(tb) != tag:
		h.err = fmt.Errorf("%w: rank %d at %s wants %q, rank 0 shares %q (ranks running different programs?)",
			ErrRendezvous, h.rank, from, tb, tag)
	}
	return h
}

func reply(c net.Conn, status byte, data []byte) error {
	c.SetWriteDeadline(time.Now().Add(rvHelloWait))
	msg := make([]byte, 5+len(data))
	msg[0] = status
	binary.BigEndian.PutUint32(msg[1:], uint32(len(data)))
	copy(msg[5:], data)
	_, err := c.Write(msg)
	return err
}

// join is a rank other than 0: it dials rank 0 until its own deadline,
// then waits for rank 0's answer until rank 0's deadline (which started
// before rank 0 could accept, so at most timeout after the connection) and
// a grace period: rank 0 answers every rank it accepted, with the reason
// when the rendezvous fails, so its explanation wins over a bare timeout.
func (r *Rendezvous) join(parent context.Context, tag string, timeout time.Duration) ([]byte, error) {
	w := r.World
	addr := w.dialAddr()
	ctx, cancel := context.WithTimeout(parent, timeout)
	defer cancel()
	var d net.Dialer
	backoff := 50 * time.Millisecond
	var c net.Conn
	var lastErr error
	for tries := 0; ; tries++ {
		var err error
		c, err = d.DialContext(ctx, "tcp", addr)
		if err == nil {
			break
		}
		lastErr = err
		if tries == 0 {
			r.logf("rendezvous: rank %d waiting for rank 0 at %s (%v)", w.Rank, addr, err)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("%w: rank %d could not reach rank 0 at %s within %v: %v (is rank 0 running, and are MASTER_ADDR and MASTER_PORT the same for every rank?)",
				ErrRendezvous, w.Rank, addr, timeout, lastErr)
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, time.Second)
	}
	defer c.Close()
	ctx, cancel = context.WithTimeout(parent, timeout+rvHelloWait)
	defer cancel()
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Now()) })
	defer stop()
	msg := make([]byte, 0, 20+len(tag))
	msg = append(msg, rvMagic...)
	msg = binary.BigEndian.AppendUint16(msg, rvVersion)
	msg = binary.BigEndian.AppendUint32(msg, uint32(w.Rank))
	msg = binary.BigEndian.AppendUint32(msg, uint32(w.Size))
	msg = binary.BigEndian.AppendUint16(msg, uint16(len(tag)))
	msg = append(msg, tag...)
	if _, err := c.Write(msg); err != nil {
		return nil, fmt.Errorf("%w: rank %d: sending to rank 0 at %s: %v", ErrRendezvous, w.Rank, addr, err)
	}
	var head [5]byte
	if _, err := io.ReadFull(c, head[:]); err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("%w: rank %d: rank 0 at %s did not answer within %v (other ranks missing?)", ErrRendezvous, w.Rank, addr, timeout+rvHelloWait)
		}
		return nil, fmt.Errorf("%w: rank %d: rank 0 at %s hung up without answering: %v (rank 0 failed, or %s is not a gpukit rendezvous?)",
			ErrRendezvous, w.Rank, addr, err, addr)
	}
	n := binary.BigEndian.Uint32(head[1:])
	if head[0] > 1 || n > rvMaxData {
		return nil, fmt.Errorf("%w: rank %d: %s answered, but not as a gpukit rendezvous (another program on MASTER_PORT %d?)",
			ErrRendezvous, w.Rank, addr, w.MasterPort)
	}
	data := make([]byte, n)
	if _, err := io.ReadFull(c, data); err != nil {
		return nil, fmt.Errorf("%w: rank %d: the answer of rank 0 at %s was cut short: %v", ErrRendezvous, w.Rank, addr, err)
	}
	if head[0] == 1 {
		return nil, fmt.Errorf("%w: rank %d: %s", ErrRendezvous, w.Rank, data)
	}
	return data, nil
}
