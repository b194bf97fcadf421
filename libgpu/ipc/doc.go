// Package ipc owns the gpukit wire protocol: msgpack envelopes framed one per
// SOCK_SEQPACKET message on Unix sockets, file descriptors passed with
// SCM_RIGHTS, peer credentials from SO_PEERCRED, errors that cross the socket as
// {code, message} and come back as the sentinel registered for the code, a
// request/reply client safe for concurrent use (with a deadline on every
// request), a connection-per-goroutine server loop, and a listener that
// refuses to steal a live daemon's socket or to listen where another user
// could replace it.
//
// The daemon side is built not to fall over: the Server refuses what passes
// its connection limit and peers its Handler will not serve (Admission: the
// one peer check of gpupool, the optimizer service and the tracer
// collector) with one frame (id 0) and a close, retries failed accepts, sheds connections when out of
// file descriptors, and lets a handler that waits end as soon as its client
// hangs up (WatchHangup); RaiseFDLimit raises the open file limit. The
// client side checks who listens before it sends anything (DialWith) and
// ends a connection whose daemon does not answer in time (SetTimeout).
//
// The format is specified in PROTOCOL.md beside this file; the limits
// (MaxMessage, MaxFDs, MaxDepth, MaxOp, MaxErrorMessage) are constants of
// this package.
package ipc
