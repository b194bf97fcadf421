#!/usr/bin/env python3
"""optimizer_client.py - an optimizer service client written from
libgpu/optim/service/PROTOCOL.md alone.

Python's standard library only; the msgpack codec and the gpupool connection
come from gpupool_client.py beside it (a client of libgpu/ipc/PROTOCOL.md).
Against `optimizer serve` over a host gpupool it puts a parameter and its
gradient in pool buffers, registers an AdamW run (settings as float64, as
Python's msgpack writes them) handing the service a pool connection of its
own, steps it, checks the update against AdamW's formula and the state the
service keeps in the pool, walks through the errors that keep the
connection open, and closes the run. It prints one line per step and "ok"
at the end, or one line on stderr and exits 1.

    python3 examples/python/optimizer_client.py --socket OPT_SOCK --pool POOL_SOCK

CI runs it (optimizer/python_test.go).
"""

import array
import math
import os
import socket
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpupool_client import Conn, MsgpackError, PoolError, pack  # noqa: E402


def peer_uid(sock):
    _, uid, _ = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
    return uid


class Service(Conn):
    """A connection to the optimizer service (framing as gpupool's)."""

    def call_fds(self, op, body, fds):
        """call, with fds sent along (SCM_RIGHTS)."""
        self.next_id += 1
        want = self.next_id
        env = {"v": 1, "t": 1, "id": want, "op": op, "body": body}
        self.sock.sendmsg([pack(env)], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
        while True:
            env, got = self.recv()
            for fd in got:
                os.close(fd)
            if env.get("id") == want:
                break
            if env.get("id") == 0 and env.get("err"):
                raise PoolError(env["err"]["code"], env["err"]["message"])
        if env.get("err"):
            raise PoolError(env["err"]["code"], env["err"]["message"])
        return env.get("body")


def pool_connection(path):
    """A new, unused connection to the pool, checked as gpupool_client checks."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.connect("\0" + path[1:] if path.startswith("@") else path)
    if peer_uid(s) not in (os.geteuid(), 0):
        s.close()
        raise PoolError("untrusted", "%s is not served by you or root" % path)
    return s


def register(svc, pool_path, body):
    """register with a fresh pool connection handed over (PROTOCOL.md, "register")."""
    p = pool_connection(pool_path)
    try:
        return svc.call_fds("register", body, [p.fileno()])
    finally:
        p.close()


def expect(code, fn, *args):
    try:
        fn(*args)
    except PoolError as e:
        if e.code != code:
            raise
        return str(e)
    raise PoolError("test", "succeeded, want %s" % code)


def f32s(b):
    return list(struct.unpack("<%df" % (len(b) // 4), b))


def main(argv):
    opts = dict(zip(argv[::2], argv[1::2]))
    if len(argv) != 4 or set(opts) != {"--socket", "--pool"}:
        print("usage: optimizer_client.py --socket OPT_SOCK --pool POOL_SOCK", file=sys.stderr)
        return 2

    svc = Service(opts["--socket"])  # checks the service's uid first
    hello, _ = svc.call("hello", {"client": "optimizer_client.py"})
    if hello.get("server") != "optimizer":
        raise PoolError("protocol", "%s answers as %r, not the optimizer service" % (opts["--socket"], hello.get("server")))
    pool_path = hello["pool"]
    print("ok hello: %s backend, pool %s, I am uid %d" % (hello["backend"], pool_path, hello["uid"]))

    # The parameter and its gradient, f32 [4, 4], in pool buffers of mine.
    pool = Conn(pool_path)
    run = "pyopt-%d" % os.getpid()
    n = 16
    w0 = [math.sin(i + 1.0) for i in range(n)]
    g = [math.cos(3.0 * i) for i in range(n)]
    bufs = {}
    for kind, vals in (("params", w0), ("grads", g)):
        name = "%s/%s/w" % (run, kind)
        l = pool.lease("alloc", {"name": name, "size": 4 * n, "dtype": "f32", "shape": [4, 4]})
        pool.write(l, struct.pack("<%df" % n, *vals))
        bufs[kind] = (name, l)
    w0 = f32s(pool.read(bufs["params"][1]))  # as f32
    g = f32s(pool.read(bufs["grads"][1]))

    def tensor(name, shape=(4, 4), **kw):
        t = {"buffer": name, "dtype": "f32", "shape": list(shape)}
        t.update(kw)
        return t

    def body(spec=None, **param):
        p = {"name": "w", "value": tensor(bufs["params"][0]), "grad": tensor(bufs["grads"][0])}
        p.update(param)
        return {"run": run, "spec": spec or {"name": "adamw"}, "params": [p]}

    # Errors that keep the connection open, each naming what is wrong.
    expect("bad_request", svc.call, "register", body())  # no pool connection handed over
    expect("optimizer.bad_tensor", register, svc, pool_path, body(value=tensor(bufs["params"][0], shape=(2**32, 2**32))))
    expect("optimizer.bad_tensor", register, svc, pool_path, body(value=tensor(bufs["params"][0], offset=2**62)))
    expect("optimizer.bad_tensor", register, svc, pool_path, body(value=tensor(run + "/params/missing")))
    msg = expect("optim.config", register, svc, pool_path, body({"name": "adamw", "lr": float("nan")}))
    if "lr" not in msg:
        raise PoolError("test", "the error does not name lr: %s" % msg)
    expect("optim.config", register, svc, pool_path, body({"name": "adamw", "beta1": 1.5}))
    expect("optim.params", register, svc, pool_path, body(value=tensor(bufs["params"][0], shape=(2, 8)), grad=tensor(bufs["grads"][0], shape=(4, 4))))
    expect("malformed", register, svc, pool_path, body({"name": "adamw", "lr": "fast"}))
    expect("optimizer.not_registered", svc.call, "step", {})
    print("ok errors: no fd, overflowing shape and offset, missing buffer, lr NaN, beta1 1.5, shapes, a str for a number, step first")

    # AdamW, float64 settings; the step's lr too.
    lr, b1, b2, eps, wd = 0.05, 0.9, 0.999, 1e-8, 0.1
    reg = register(svc, pool_path, body({"name": "adamw", "lr": 0.01, "beta1": b1, "beta2": b2, "eps": eps, "weight_decay": wd}))
    names = [s["name"] for s in reg["state"]]
    if names != ["w.exp_avg", "w.exp_avg_sq", "step"]:
        raise PoolError("test", "state %r" % names)
    expect("optimizer.registered", register, svc, pool_path, body())
    print("ok register %s: state %s" % (run, ", ".join(names)))
    st, _ = svc.call("step", {"lr": lr})
    if st["step"] not in (1, -1):  # -1: AdamW counts on the device (the "step" state)
        raise PoolError("test", "step reply %r" % st)
    # One AdamW step from zero moments (PyTorch's AdamW): the bias-corrected
    # moments are g and g², so w ← w(1 − lr·wd) − lr·g/(|g| + eps).
    got = f32s(pool.read(bufs["params"][1]))
    for i in range(n):
        want = w0[i] * (1 - lr * wd) - lr * g[i] / (abs(g[i]) + eps)
        if abs(got[i] - want) > 1e-5 * (abs(w0[i]) + lr):
            raise PoolError("test", "w[%d] = %r after the step, want %r" % (i, got[i], want))
    print("ok step 1: the parameter moved as AdamW's formula says")

    # The state lives in the pool, under the run's names, and is mine.
    for s in reg["state"]:
        l = pool.lease("open", {"name": s["tensor"]["buffer"]})
        raw = pool.read(l)
        if s["name"] == "w.exp_avg":
            m = f32s(raw)[:n]
            if any(abs(m[i] - (1 - b1) * g[i]) > 1e-6 for i in range(n)):
                raise PoolError("test", "exp_avg %r" % m)
        if s["name"] == "step" and struct.unpack("<i", raw[:4])[0] != 1:
            raise PoolError("test", "step counter %r" % raw[:4])
        pool.call("free", {"handle": l["handle"]})
    stats, _ = svc.call("stats")
    if stats.get("run") != run or stats["max_conns"] <= 0 or stats["run_bytes"] <= 0:
        raise PoolError("test", "stats %r" % stats)
    print("ok state in the pool, stats: %d bytes of state, %d connections at most" % (stats["run_bytes"], stats["max_conns"]))

    svc.call("close")
    stats, _ = svc.call("stats")
    if "run" in stats:
        raise PoolError("test", "stats after close %r" % stats)
    print("ok close")
    for kind in bufs:
        pool.call("free", {"handle": bufs[kind][1]["handle"]})
    pool.close()
    svc.close()
    print("ok")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except (PoolError, OSError, MsgpackError) as e:
        print("optimizer_client.py: %s" % e, file=sys.stderr)
        sys.exit(1)
