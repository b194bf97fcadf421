// Package chrome owns the Chrome Trace Event JSON that tracer writes and
// reads: a Writer that keeps the file valid JSON after every write (so any
// stop, even SIGKILL between writes, leaves a file Perfetto opens), appenders
// for the events tracer emits, and Read/Validate for the checks the tests and
// `tracer report` make.
//
// The file is the JSON Object Format of the Trace Event Format
// (https://docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU):
//
//	{"displayTimeUnit":"ns","traceEvents":[
//	{...},
//	{...}
//	]}
//
// Events are X (complete: ts and dur), i (instant, thread scope), C
// (counter), M (process_name, thread_name) and s/f (flow start and finish,
// finish bound to the enclosing slice with "bp":"e"). ts and dur are in
// microseconds with nanosecond digits; ts is CLOCK_MONOTONIC.
package chrome
