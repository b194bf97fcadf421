// Package trace is the client every gpukit tool uses to put its work on one
// timeline: spans (category, name, up to MaxArgs arguments), instants,
// counters, flow ids that join a message sent by one process to its handling
// in another, and GPU time measured with CUDA events. The collector is the
// tracer tool (tracer serve / tracer record), which writes Chrome Trace Event
// JSON that Perfetto and chrome://tracing open.
//
// # Off by default, cheap when on
//
// Tracing is on only when a tool is given --trace SOCK or the environment
// has GPUKIT_TRACE=SOCK (Setup, FromEnv); otherwise the *Tracer is nil and
// every method is a nil check. When on, recording an event copies it into a
// fixed ring of preallocated records (a bounded lock-free queue): no
// allocation, no lock, no system call. Strings (categories, names, argument
// keys) are referenced, not copied, so pass constants or strings that live
// anyway. A background goroutine drains the ring every 20 ms (or when it is
// half full) and sends batches. When the ring is full, or the collector is
// down or too slow (a send that does not finish within 100 ms), events are
// dropped and counted (Stats, Summary); recording never blocks. A sender
// with no collector tries to connect again at most once a second.
//
// # Clock
//
// Every timestamp is CLOCK_MONOTONIC in nanoseconds, which all processes of
// a host share, so spans of different processes line up without clock
// exchange. Go's monotonic clock has the same rate with a per-process
// origin; Open measures the offset once (error well under 1 µs).
//
// # Wire format
//
// A client sends datagrams on a SOCK_SEQPACKET Unix socket ("unixpacket"),
// once it has checked that the collector runs as its own user or root
// (SO_PEERCRED; else it sends nothing and says why in Stats and Summary),
// one batch per datagram, at most MaxBatch (64 KiB) bytes; nothing is sent
// back. All integers are little-endian; a string is u16 length + bytes
// (at most MaxString = 512 bytes, UTF-8 expected; the collector replaces
// invalid bytes).
//
//	batch   = "GKT1" | u32 pid | u32 dropped-so-far | u16 n | n × record
//	record  = u8 kind | u32 track | i64 ts (ns, CLOCK_MONOTONIC, >= 0) | body
//	kind 1 span:    i64 dur (>= 0) | str cat | str name | u8 flowdir
//	                [u64 flow, != 0, when flowdir is 1 (out) or 2 (in)] | args
//	kind 2 instant: str cat | str name | args
//	kind 3 counter: str name | f64 value (finite)
//	kind 4 track:   str name (names track "track" of this process)
//	kind 5 process: str name (names this process)
//	args    = u8 n (<= 4) | n × (str key | u8 type | value)
//	          type 1: i64; type 2: str; type 3: f64 (finite)
//
// Names must not be empty. pid is the sender's own: the collector takes a
// connection's batches only for its SO_PEERCRED pid (a batch naming
// another is refused and counted), and only from peers it admits (its own
// uid, root, and those it was told to); a peer it refuses gets one notice,
// "GKT1!" and the reason, and is closed (the client reports it in Stats
// and Summary). The first batch on every connection carries the
// process name and the names of the tracks made so far. Track 0 is the main
// track. A batch that breaks any rule is refused whole (DecodeBatch returns
// an error wrapping ErrMalformed); the collector counts it and keeps the
// connection, unless it is the connection's first datagram and does not
// start with "GKT1": that peer is not a trace client (a gpupool client
// given the tracer's socket, say), so the collector sends it one datagram,
// "GKT1!" and a line of text saying what the socket is, and closes the
// connection. The gpukit ipc client reports that as a tracer collector's
// socket; a trace client whose send fails reads what the peer said last
// and reports a gpukit ipc daemon's error frame as "not a tracer
// collector's socket".
//
// # Flows
//
// A span that sends a request calls FlowOut(id) and the span that handles it
// (in the daemon) FlowIn(id), with the request's flow id (ipc.FlowFrom, or
// the Flow field of an ipc.Message). The collector writes the Chrome flow
// pair "s"/"f" only when both ends arrived, so every flow in a file pairs up.
//
// # GPU spans
//
// A GPUTimer records a pair of CUDA events around a region of one stream:
// each op in eager mode, each graph launch in graph mode. The events come
// through the GPUEvents interface; libgpu/trace/cudaev implements it with
// the CUDA driver, so this package links no CUDA and the tracer tool,
// which imports it to read traces, links none (its TestLinksNoCUDA
// checks). The duration is
// cuEventElapsedTime of the pair (resolution about 0.5 µs). The start on the
// host clock is not measured by CUDA and is estimated from three facts:
//
//   - the start event cannot run before the host recorded it: start >= h,
//     the host time read just before cuEventRecord (lower bound);
//   - regions of a stream run in order, and cuEventElapsedTime between the
//     previous region's start event and this one gives their exact gap on
//     the GPU clock: start >= previous estimate + gap;
//   - the poller saw the end event complete at host time p: start <= p - dur
//     (upper bound).
//
// The estimate is the largest lower bound, capped by the upper bound. When
// the stream was idle at the record (the common case at the start of a step)
// the error is the launch latency, a few µs; while the stream is busy the
// gap chain carries the last such anchor forward, and the poll interval (200
// µs) bounds any error from above. The GPU spans go on a track of their own
// per stream, named "GPU: name", in the process that owns the stream.
package trace
