#!/usr/bin/env python3
"""gpupool_client.py - a gpupool client written from libgpu/ipc/PROTOCOL.md alone.

It needs nothing but Python's standard library: it carries its own small
msgpack codec (the few types the protocol uses), talks SOCK_SEQPACKET with
SCM_RIGHTS, checks the daemon's credentials before sending anything, and maps
host (memfd) slabs with mmap. Against a host daemon it walks through the
protocol: hello; create, write and seal a named buffer; open it from a second
connection and read it back; the errors that keep a connection open; a free
that wants no reply; ls page by page; stats; rm. It prints one line per step
and "ok" at the end, or one line on stderr and exits 1.

    python3 examples/python/gpupool_client.py [--socket PATH]

The socket defaults to $GPUKIT_POOL_SOCKET, else $XDG_RUNTIME_DIR/gpukit/pool.sock,
else /tmp/gpukit-$UID/pool.sock, as gpupool's own. CI runs this script
(gpupool/python_test.go) against `gpupool serve --backend host`.
"""

import errno
import fcntl
import mmap
import os
import socket
import struct
import sys

# ---------------------------------------------------------------- msgpack


class MsgpackError(ValueError):
    pass


def pack(v, out=None):
    """Encodes v (None, bool, int, float, str, bytes, list, tuple, dict)."""
    b = bytearray() if out is None else out
    if v is None:
        b.append(0xC0)
    elif v is True:
        b.append(0xC3)
    elif v is False:
        b.append(0xC2)
    elif isinstance(v, int):
        if 0 <= v <= 0x7F:
            b.append(v)
        elif v >= 0:
            for code, fmt, top in ((0xCC, ">B", 0xFF), (0xCD, ">H", 0xFFFF), (0xCE, ">I", 0xFFFFFFFF), (0xCF, ">Q", 2**64 - 1)):
                if v <= top:
                    b.append(code)
                    b += struct.pack(fmt, v)
                    break
            else:
                raise MsgpackError("integer too large: %d" % v)
        elif v >= -32:
            b += struct.pack(">b", v)
        else:
            for code, fmt, bottom in ((0xD0, ">b", -(2**7)), (0xD1, ">h", -(2**15)), (0xD2, ">i", -(2**31)), (0xD3, ">q", -(2**63))):
                if v >= bottom:
                    b.append(code)
                    b += struct.pack(fmt, v)
                    break
            else:
                raise MsgpackError("integer too small: %d" % v)
    elif isinstance(v, float):
        b.append(0xCB)
        b += struct.pack(">d", v)
    elif isinstance(v, str):
        s = v.encode("utf-8")
        n = len(s)
        if n <= 31:
            b.append(0xA0 | n)
        elif n <= 0xFF:
            b += bytes((0xD9, n))
        elif n <= 0xFFFF:
            b.append(0xDA)
            b += struct.pack(">H", n)
        else:
            b.append(0xDB)
            b += struct.pack(">I", n)
        b += s
    elif isinstance(v, (bytes, bytearray)):
        n = len(v)
        if n <= 0xFF:
            b += bytes((0xC4, n))
        elif n <= 0xFFFF:
            b.append(0xC5)
            b += struct.pack(">H", n)
        else:
            b.append(0xC6)
            b += struct.pack(">I", n)
        b += v
    elif isinstance(v, (list, tuple)):
        n = len(v)
        if n <= 15:
            b.append(0x90 | n)
        elif n <= 0xFFFF:
            b.append(0xDC)
            b += struct.pack(">H", n)
        else:
            b.append(0xDD)
            b += struct.pack(">I", n)
        for x in v:
            pack(x, b)
    elif isinstance(v, dict):
        n = len(v)
        if n <= 15:
            b.append(0x80 | n)
        elif n <= 0xFFFF:
            b.append(0xDE)
            b += struct.pack(">H", n)
        else:
            b.append(0xDF)
            b += struct.pack(">I", n)
        for k, x in v.items():
            pack(k, b)
            pack(x, b)
    else:
        raise MsgpackError("cannot encode %r" % type(v))
    return bytes(b) if out is None else b


def unpack(data):
    """Decodes exactly one msgpack value from data (str as str, bin as bytes)."""
    v, p = _unpack(memoryview(data), 0, 0)
    if p != len(data):
        raise MsgpackError("%d trailing bytes" % (len(data) - p))
    return v


def _take(d, p, n):
    if p + n > len(d):
        raise MsgpackError("truncated")
    return bytes(d[p : p + n]), p + n


def _unpack(d, p, depth):
    if depth > 32:
        raise MsgpackError("nested too deep")
    c, p = _take(d, p, 1)
    c = c[0]
    if c <= 0x7F:
        return c, p
    if c >= 0xE0:
        return c - 0x100, p
    if 0x80 <= c <= 0x8F:
        return _map(d, p, c & 0x0F, depth)
    if 0x90 <= c <= 0x9F:
        return _array(d, p, c & 0x0F, depth)
    if 0xA0 <= c <= 0xBF:
        s, p = _take(d, p, c & 0x1F)
        return s.decode("utf-8"), p
    if c == 0xC0:
        return None, p
    if c in (0xC2, 0xC3):
        return c == 0xC3, p
    fixed = {0xCC: ">B", 0xCD: ">H", 0xCE: ">I", 0xCF: ">Q", 0xD0: ">b", 0xD1: ">h", 0xD2: ">i", 0xD3: ">q", 0xCA: ">f", 0xCB: ">d"}
    if c in fixed:
        fmt = fixed[c]
        raw, p = _take(d, p, struct.calcsize(fmt))
        return struct.unpack(fmt, raw)[0], p
    lens = {0xD9: ">B", 0xDA: ">H", 0xDB: ">I", 0xC4: ">B", 0xC5: ">H", 0xC6: ">I", 0xDC: ">H", 0xDD: ">I", 0xDE: ">H", 0xDF: ">I"}
    if c in lens:
        fmt = lens[c]
        raw, p = _take(d, p, struct.calcsize(fmt))
        n = struct.unpack(fmt, raw)[0]
        if c in (0xD9, 0xDA, 0xDB):
            s, p = _take(d, p, n)
            return s.decode("utf-8"), p
        if c in (0xC4, 0xC5, 0xC6):
            return _take(d, p, n)
        if c in (0xDC, 0xDD):
            return _array(d, p, n, depth)
        return _map(d, p, n, depth)
    raise MsgpackError("unsupported msgpack type byte 0x%02x" % c)


def _array(d, p, n, depth):
    out = []
    for _ in range(n):
        v, p = _unpack(d, p, depth + 1)
        out.append(v)
    return out, p


def _map(d, p, n, depth):
    out = {}
    for _ in range(n):
        k, p = _unpack(d, p, depth + 1)
        v, p = _unpack(d, p, depth + 1)
        out[k] = v
    return out, p


# ---------------------------------------------------------------- protocol

MAX_MESSAGE = 128 << 10  # frame size limit
MAX_FDS = 8
F_GET_SEALS = getattr(fcntl, "F_GET_SEALS", 1034)
SEALS = getattr(fcntl, "F_SEAL_SEAL", 1) | getattr(fcntl, "F_SEAL_SHRINK", 2) | getattr(fcntl, "F_SEAL_GROW", 4)


class PoolError(Exception):
    """A failed reply: code names the error (PROTOCOL.md, "Errors")."""

    def __init__(self, code, message):
        super().__init__("%s (%s)" % (message, code))
        self.code = code


def default_socket():
    if os.environ.get("GPUKIT_POOL_SOCKET"):
        return os.environ["GPUKIT_POOL_SOCKET"]
    if os.environ.get("XDG_RUNTIME_DIR"):
        return os.path.join(os.environ["XDG_RUNTIME_DIR"], "gpukit", "pool.sock")
    return "/tmp/gpukit-%d/pool.sock" % os.getuid()


class Conn:
    """One connection to gpupool: requests, replies and the slabs it mapped."""

    def __init__(self, path):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.sock.settimeout(30)  # every call has a deadline
        self.sock.connect("\0" + path[1:] if path.startswith("@") else path)
        # Who listens? Check before sending anything (PROTOCOL.md, "Connecting").
        pid, uid, gid = struct.unpack("3i", self.sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
        trusted = {os.geteuid(), 0} | {int(u) for u in os.environ.get("GPUKIT_POOL_UID", "").replace(",", " ").split()}
        if uid not in trusted:
            self.sock.close()
            raise PoolError("untrusted", "%s is served by uid %d (pid %d), not by you or root" % (path, uid, pid))
        self.next_id = 0
        self.slabs = {}  # slab id -> (mmap, fd, size)

    def send(self, op, body=None, noreply=False):
        self.next_id += 1
        env = {"v": 1, "t": 1, "id": self.next_id, "op": op}
        if body is not None:
            env["body"] = body
        if noreply:
            env["noreply"] = True
        self.sock.sendmsg([pack(env)])
        return self.next_id

    def recv(self):
        """One frame: (envelope, fds)."""
        for attempt in (0, 1):
            try:
                data, anc, flags, _ = self.sock.recvmsg(MAX_MESSAGE + 1, socket.CMSG_SPACE(MAX_FDS * 4), getattr(socket, "MSG_CMSG_CLOEXEC", 0))
                break
            except ConnectionResetError:
                # The daemon closed with requests of ours unread: Linux says
                # so once, then hands over what the daemon sent before.
                if attempt:
                    raise
        fds = []
        for level, kind, raw in anc:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds += struct.unpack("%di" % (len(raw) // 4), raw[: len(raw) - len(raw) % 4])
        if not data:
            raise PoolError("closed", "the daemon closed the connection")
        if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
            raise PoolError("malformed", "frame or fds cut")
        if data[:4] == b"GKT1":
            raise PoolError("malformed", "this is a tracer collector's socket, not gpupool's")
        env = unpack(data)
        return env, fds

    def call(self, op, body=None):
        """Sends a request and returns (reply body, fds); a failed reply raises."""
        want = self.send(op, body)
        while True:
            env, fds = self.recv()
            if env.get("id") == want:
                break
            for fd in fds:
                os.close(fd)
            if env.get("id") == 0 and env.get("err"):
                # The daemon's last word before it closes (a refusal).
                raise PoolError(env["err"]["code"], env["err"]["message"])
        if env.get("err"):
            for fd in fds:
                os.close(fd)
            raise PoolError(env["err"]["code"], env["err"]["message"])
        return env.get("body"), fds

    def lease(self, op, body):
        """alloc or open: maps the slab on first sight; returns the lease."""
        l, fds = self.call(op, body)
        for sid in l.get("dropped") or []:
            self.unmap(sid)
        if l.get("fd"):
            if len(fds) != 1 or l["slab"] in self.slabs:
                raise PoolError("protocol", "lease says fd and carries %d fds" % len(fds))
            fd = fds[0]
            if l["kind"] != 1:
                raise PoolError("protocol", "slab kind %d: this example maps host (memfd) slabs only" % l["kind"])
            seals = fcntl.fcntl(fd, F_GET_SEALS)
            if seals & SEALS != SEALS or os.fstat(fd).st_size != l["slab_size"]:
                raise PoolError("protocol", "slab %d not sealed against resizing (seals %#x)" % (l["slab"], seals))
            # The whole slab from offset 0, once.
            m = mmap.mmap(fd, l["slab_size"], mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            self.slabs[l["slab"]] = (m, fd, l["slab_size"])
        elif fds:
            raise PoolError("protocol", "unexpected fds")
        return l

    def write(self, l, data):
        """Writes data at the start of the leased buffer (slab base + offset)."""
        m = self.slabs[l["slab"]][0]
        m[l["offset"] : l["offset"] + len(data)] = data

    def read(self, l):
        """The leased buffer's bytes."""
        m = self.slabs[l["slab"]][0]
        return m[l["offset"] : l["offset"] + l["size"]]

    def unmap(self, sid):
        m, fd, _ = self.slabs.pop(sid, (None, None, None))
        if m is not None:
            m.close()
            os.close(fd)

    def close(self):
        for sid in list(self.slabs):
            self.unmap(sid)
        self.sock.close()


def expect_error(conn, code, op, body=None):
    try:
        conn.call(op, body)
    except PoolError as e:
        if e.code != code:
            raise
        return
    raise PoolError("test", "%s succeeded, want %s" % (op, code))


def main(argv):
    path = default_socket()
    if len(argv) == 2 and argv[0] == "--socket":
        path = argv[1]
    elif argv:
        print("usage: gpupool_client.py [--socket PATH]", file=sys.stderr)
        return 2

    a = Conn(path)
    hello, _ = a.call("hello", {"client": "gpupool_client.py"})
    if hello.get("server") != "gpupool" or hello.get("protocol", 1) != 1:
        raise PoolError("protocol", "%s answers as %r protocol %r, not gpupool protocol 1" % (path, hello.get("server"), hello.get("protocol")))
    if hello["share"] != 1:
        raise PoolError("protocol", "the daemon shares %s memory; this example maps host (memfd) slabs only" % hello["backend"])
    print("ok hello: %s backend, slabs of %d bytes, align %d" % (hello["backend"], hello["slab_size"], hello["align"]))

    # Create, write, seal.
    name = "pyclient/%d" % os.getpid()
    n = 4096 + os.getpid() % 1000
    data = bytes((i * 7 + 3) & 0xFF for i in range(n))
    l = a.lease("alloc", {"name": name, "size": n, "keep": True, "unsealed": True, "dtype": "u8", "shape": [n]})
    if l["offset"] % hello["align"] or l["size"] != n or l.get("sealed"):
        raise PoolError("test", "lease %r" % l)
    a.write(l, data)
    a.call("seal", {"handle": l["handle"]})
    print("ok create %s: %d bytes at offset %d of slab %d" % (name, n, l["offset"], l["slab"]))

    # Open from another connection; read it back.
    b = Conn(path)
    lb = b.lease("open", {"name": name, "wait_ms": 1000})
    if b.read(lb) != data or not lb.get("sealed") or lb.get("dtype") != "u8" or lb.get("shape") != [n]:
        raise PoolError("test", "opened buffer differs: %r" % {k: lb[k] for k in lb if k != "legacy"})
    print("ok open from a second connection: same %d bytes" % n)

    # Errors that keep the connection open.
    expect_error(b, "pool.no_such_name", "open", {"name": name + "/missing"})
    expect_error(b, "unknown_op", "frobnicate", {})
    expect_error(b, "pool.bad_name", "alloc", {"name": "a//b", "size": 1})
    expect_error(b, "malformed", "alloc", {"size": "large"})
    print("ok errors: no_such_name, unknown_op, bad_name, malformed body")

    # A free that wants no reply, then a request that is answered in order.
    small = b.lease("alloc", {"size": 100})
    b.send("free", {"handle": small["handle"]}, noreply=True)
    st, _ = b.call("stats")
    print("ok noreply free, then stats: %d bytes used in %d allocations" % (st["used"], st["allocations"]))

    # ls, page by page (a page of one, to see the cursor at work).
    extra = ["%s-%d" % (name, i) for i in range(3)]
    for x in extra:
        b.lease("alloc", {"name": x, "size": 10, "keep": True})
    seen, after, pages = [], None, 0
    while True:
        page, _ = b.call("ls", {"after": after, "limit": 1} if after else {"limit": 1})
        seen += page["buffers"]
        pages += 1
        after = page.get("next")
        if not after:
            break
    listed = [x.get("name") for x in seen]
    if any(x not in listed for x in [name] + extra) or len(set(listed)) != len(listed) or pages < 4:
        raise PoolError("test", "ls listed %r in %d pages" % (listed, pages))
    for x in extra:
        b.call("free", {"name": x})
    print("ok ls: %d buffers in %d pages" % (len(seen), pages))

    # Free the leases, remove the name.
    b.call("free", {"handle": lb["handle"]})
    a.call("free", {"handle": l["handle"]})
    a.call("free", {"name": name})
    expect_error(a, "pool.no_such_name", "open", {"name": name})
    print("ok rm %s" % name)
    a.close()
    b.close()
    print("ok")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except (PoolError, OSError, MsgpackError) as e:
        print("gpupool_client.py: %s" % e, file=sys.stderr)
        sys.exit(1)
