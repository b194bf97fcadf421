// Package ipc owns the gpukit wire protocol: msgpack envelopes framed one per
// SOCK_SEQPACKET message on Unix sockets, file descriptors passed with
// SCM_RIGHTS, peer credentials from SO_PEERCRED, errors that cross the socket as
// {code, message} and come back as the sentinel registered for the code, a
// request/reply client safe for concurrent use, a connection-per-goroutine
// server loop, and a listener that refuses to steal a live daemon's socket.
//
// The format is specified in PROTOCOL.md beside this file; the limits
// (MaxMessage, MaxFDs, MaxDepth) are constants of this package.
package ipc
