// Package cli is the command-line layer every gpukit tool shares, so that a
// fix to CLI behaviour is made once. It owns, on top of urfave/cli/v2:
//
//   - exit statuses: 0 ok, 1 runtime failure, 2 usage (an unknown command or
//     flag, a bad flag value, a missing argument) and for something not built
//     yet; a command's own status where one is passed on (cli.Exit);
//   - errors printed as ONE line on stderr, "TOOL: message", and never the
//     whole help for a bad flag;
//   - flags accepted after positional arguments (Permute);
//   - --version on every tool (Version);
//   - byte sizes spelled in IEC or SI units (ParseSize, FormatSize, SizeFlag);
//   - --trace (TraceFlag, StartTrace), JSON lines (JSONLine), float32
//     defaults shown without float64 noise (F32), the not-built-yet command
//     (NotBuilt), refusing to replace an existing --out (ForceFlag,
//     CheckOut) and to create a missing socket directory (CheckSocketDir);
//   - the progress bar with ETA of every long job (Progress), on stderr
//     when it is a terminal or GPUKIT_PROGRESS=always;
//   - numeric flags checked as they are parsed (Setup: no negative
//     integers or durations, no NaN or infinite floats; IntAtLeast and
//     FloatWhere for narrower ranges), and requests refused when their
//     memory need exceeds what is available (CheckMemory);
//   - which peers a daemon serves: --allow-uid and --group (PeerFlags,
//     Admission, LookupGroup, AllowUIDs);
//   - where a tool computes: --device, --pool, --precision and --graph and
//     the allocator they open, in the subpackage devflag (it imports the
//     compute stack, which this package does not: the tracer links no
//     CUDA).
//
// A tool's main is one line: os.Exit(cli.Main(app.New(), os.Args)). Flags
// live only here (and in devflag) and in the tools' CLI packages; no other
// library defines one.
// TOOLS.md states the contract these functions implement.
package cli
