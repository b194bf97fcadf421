#!/usr/bin/env python3
"""gpupool_cupy.py — read a named gpupool buffer from CuPy, zero copy.

    python3 gpupool_cupy.py --socket SOCK NAME [--dtype float32] [--shape 4,5] [--timeout 10]

Connects to a gpupool daemon (SOCK_SEQPACKET Unix socket, msgpack frames;
libgpu/ipc/PROTOCOL.md), opens the named buffer, which must have been made
with legacy=true (gpupool put --legacy, or CreateOptions{Legacy: true}, or a
daemon run with --legacy-ipc), maps its 64-byte CUipcMemHandle with
cupy.cuda.runtime.ipcOpenMemHandle, and prints one JSON line:

    {"name": ..., "size": ..., "dtype": ..., "shape": [...], "sum": ..., "head": [...]}

dtype and shape default to the metadata stored with the buffer (uint8 and
the byte count when none). Exits 1 with one line on stderr on error.
Needs: cupy, msgpack.
"""
import argparse
import json
import os
import socket
import sys

import msgpack

VERSION = 1
GPUKIT_DTYPES = {"f32": "float32", "f16": "float16", "bf16": None, "i32": "int32", "u8": "uint8"}


class PoolError(Exception):
    pass


class Pool:
    def __init__(self, path):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.sock.connect("\0" + path[1:] if path.startswith("@") else path)
        self.next_id = 0
        self.call("hello", {"client": "gpupool_cupy.py"})

    def call(self, op, body=None):
        self.next_id += 1
        msg = {"v": VERSION, "t": 1, "id": self.next_id, "op": op, "flow": int.from_bytes(os.urandom(7), "little") | 1}
        if body is not None:
            msg["body"] = body
        self.sock.send(msgpack.packb(msg, use_bin_type=True))
        # Legacy leases carry no fds; anything unexpected is closed.
        data, anc, _, _ = self.sock.recvmsg(128 << 10, socket.CMSG_SPACE(8 * 4))
        for level, typ, fds in anc:
            if level == socket.SOL_SOCKET and typ == socket.SCM_RIGHTS:
                for i in range(0, len(fds) - len(fds) % 4, 4):
                    os.close(int.from_bytes(fds[i:i + 4], "little"))
        if not data:
            raise PoolError("the daemon closed the connection")
        reply = msgpack.unpackb(data, raw=False)
        if reply.get("err"):
            e = reply["err"]
            raise PoolError(f'{e.get("message", e.get("code"))}')
        return reply.get("body") or {}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("name")
    ap.add_argument("--socket", default=os.environ.get("GPUKIT_POOL_SOCKET", ""))
    ap.add_argument("--dtype", default="")
    ap.add_argument("--shape", default="")
    ap.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for an unsealed buffer")
    ap.add_argument("--head", type=int, default=8, help="values to print")
    a = ap.parse_args()
    if not a.socket:
        sys.exit("gpupool_cupy.py: --socket (or GPUKIT_POOL_SOCKET) is required")

    import cupy as cp

    try:
        pool = Pool(a.socket)
        lease = pool.call("open", {"name": a.name, "wait_ms": int(a.timeout * 1000)})
    except (OSError, PoolError) as e:
        sys.exit(f"gpupool_cupy.py: {e}")
    handle = lease.get("legacy")
    if not handle or len(handle) != 64:
        sys.exit(f"gpupool_cupy.py: {a.name} has no legacy IPC handle (make it with --legacy, or run the daemon with --legacy-ipc)")
    size = lease["size"]
    dtype = a.dtype or GPUKIT_DTYPES.get(lease.get("dtype", ""), None) or "uint8"
    shape = [int(x) for x in a.shape.split(",")] if a.shape else lease.get("shape") or [size // cp.dtype(dtype).itemsize]

    ptr = cp.cuda.runtime.ipcOpenMemHandle(bytes(handle))
    try:
        mem = cp.cuda.UnownedMemory(ptr + lease.get("offset", 0), size, pool)
        arr = cp.ndarray(shape, dtype=dtype, memptr=cp.cuda.MemoryPointer(mem, 0))
        flat = arr.ravel()
        out = {
            "name": a.name, "size": size, "dtype": str(arr.dtype), "shape": list(arr.shape),
            "sum": float(flat.astype(cp.float64).sum()),
            "head": [v.item() for v in flat[: a.head].get()],
        }
        cp.cuda.Device().synchronize()
    finally:
        cp.cuda.runtime.ipcCloseMemHandle(ptr)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
