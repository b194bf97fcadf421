#!/usr/bin/env bash
# Builds, on any machine (no GPU, no CUDA needed), what a GPU machine runs:
#   build/gpu/gpukit-gpu.tar.xz  holding
#     bin/        static, stripped tool binaries
#     tests/      `go test -c` binaries of every package with GPU tests,
#                 each with the list of its GPU tests and its testdata/
#     bench/      the benchmark driver, bench/run.sh and bench/reference/*.py
#     run.sh      runs every GPU test with GPUKIT_REQUIRE_GPU=1 and ends with
#                 one line "N passed, N failed"
#     par.sh      the same as parallel shards sharing the GPU (pass/fail
#                 only, not timings: scripts/gpu-par.sh)
#   build/gpu/run.sh   unpacks the archive into a temp dir and runs it
# A GPU test is a Test function whose body calls RequireGPU (libgpu/cuda/cudatest).
# BUNDLE_PKGS=REGEX keeps only the test packages whose directory matches
# (e.g. 'libgpu/ops|trainer'), to keep what travels to a GPU machine small.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
out=build/gpu
stage=build/gpu-stage
rm -rf "$out" "$stage"
mkdir -p "$out" "$stage/bin" "$stage/tests" "$stage/bench"
export CGO_ENABLED=0 GOOS=linux GOARCH=amd64
ldflags="-s -w -X gpukit/libgpu/cli.version=$(git describe --tags --always --dirty 2>/dev/null || echo devel)"

for t in gpupool kernelc trainer sampler optimizer tracer; do
	(cd "$t" && go build -trimpath -ldflags="$ldflags" -o "$root/$stage/bin/$t" .)
done
if [ -d bench/cmd ]; then
	(cd bench && go build -trimpath -ldflags="$ldflags" -o "$root/$stage/bench/gpukit-bench" ./cmd/gpukit-bench)
	(cd bench && go build -trimpath -ldflags="$ldflags" -o "$root/$stage/bench/gpukit-poolbench" ./cmd/gpukit-poolbench)
	(cd bench && go build -trimpath -ldflags="$ldflags" -o "$root/$stage/bench/gpukit-trainbench" ./cmd/gpukit-trainbench)
	(cd bench && go build -trimpath -ldflags="$ldflags" -o "$root/$stage/bench/gpukit-allreduce" ./cmd/gpukit-allreduce)
	(cd bench && go build -trimpath -ldflags="$ldflags" -o "$root/$stage/bench/gpukit-optimplot" ./cmd/gpukit-optimplot)
fi
cp -r bench/*.sh bench/report.py bench/conv_table.py bench/video-880m.json bench/workloads.json bench/reference "$stage/bench/"
mkdir -p "$stage/bench/kernels" && cp libgpu/kernels/*.cu libgpu/kernels/*.cuh "$stage/bench/kernels/"
# The default text of the GPT tests (data.DefaultTextPath finds it through
# Go's GOROOT, which a GPU machine without Go lacks): run.sh points
# GPUKIT_TEXT at it unless set, so GPU tests train on real text, not their
# synthetic stand-in (a periodic word list the models memorise).
mkdir -p "$stage/data" && cp "$(go env GOROOT)/src/testdata/Isaac.Newton-Opticks.txt" "$stage/data/"

# Packages with GPU tests, and the names of those tests: Test functions that
# call RequireGPU, plus the ones named in scripts/gpu-tests.txt (tests that
# need a GPU another way, such as testscript scripts guarded by [gpu]).
n=0
while IFS= read -r dir; do
	names=$( {
		# Helpers whose body calls RequireGPU, then Test functions whose body
		# calls RequireGPU or one of those helpers.
		fnname='/^func / { match($0, /^func (\([^)]*\) )?[A-Za-z0-9_]+/); fn = substr($0, RSTART, RLENGTH); sub(/.* /, "", fn) }'
		helpers=$(awk "$fnname"' /[Rr]equireGPU\(/ && fn !~ /^Test/ { print fn }' "$dir"/*_test.go | sort -u | paste -sd' ')
		awk -v helpers="$helpers" "$fnname"'
		BEGIN { n = split(helpers, h, " ") }
		fn ~ /^Test/ {
			if ($0 ~ /[Rr]equireGPU\(/) { print fn; next }
			for (i = 1; i <= n; i++) if (index($0, h[i] "(")) { print fn; next }
		}
		' "$dir"/*_test.go
		awk -v d="$dir" '$1 == d { print $2 }' scripts/gpu-tests.txt
	} | sort -u)
	[ -n "$names" ] || continue
	if [ -n "${BUNDLE_PKGS:-}" ] && ! [[ $dir =~ ^($BUNDLE_PKGS)$ ]]; then continue; fi
	mod=${dir%%/*}
	rel=${dir#"$mod"}; rel=${rel#/}
	name=$(echo "$dir" | tr '/' '_')
	(cd "$mod" && go test -c -trimpath -ldflags="$ldflags" -o "$root/$stage/tests/$name.test" "./$rel")
	mkdir -p "$stage/tests/$name.d"
	echo "$names" >"$stage/tests/$name.d/TESTS"
	[ -d "$dir/testdata" ] && cp -r "$dir/testdata" "$stage/tests/$name.d/"
	awk -v d="$dir" '$1 == d { print $2 }' scripts/gpu-files.txt | while read -r f; do
		mkdir -p "$stage/tests/$name.d/testdata" && cp "$f" "$stage/tests/$name.d/testdata/"
	done
	n=$((n + 1))
done < <( {
	grep -rlE '[Rr]equireGPU\(' --include='*_test.go' libgpu gpupool kernelc trainer sampler optimizer tracer | xargs -r -n1 dirname
	awk '!/^#/ && NF { print $1 }' scripts/gpu-tests.txt
} | sort -u)

cat >"$stage/run.sh" <<'RUN'
#!/usr/bin/env bash
# Runs every GPU test binary with GPUKIT_REQUIRE_GPU=1 (a GPU test that skips
# fails) and ends with one line: N passed, N failed. GPUKIT_TEST_RUN and
# GPUKIT_TEST_SKIP replace the test selection (go test's -run and -skip).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
export GPUKIT_REQUIRE_GPU=1 PATH="$here/bin:$PATH" GPUKIT_BIN="$here/bin"
export GPUKIT_CACHE_DIR=${GPUKIT_CACHE_DIR:-$(mktemp -d)}
export GPUKIT_TEXT=${GPUKIT_TEXT:-$here/data/Isaac.Newton-Opticks.txt}
logdir=${GPUKIT_LOG_DIR:-$here/logs}
mkdir -p "$logdir"
pass=0 fail=0
for t in "$here"/tests/*.test; do
	name=$(basename "$t" .test)
	d="$here/tests/$name.d"
	re="^($(paste -sd'|' "$d/TESTS"))\$"
	[ -n "${GPUKIT_TEST_RUN:-}" ] && re=$GPUKIT_TEST_RUN
	echo "== $name"
	(cd "$d" && "$t" -test.v -test.count=1 -test.timeout=20m -test.run "$re" ${GPUKIT_TEST_SKIP:+-test.skip "$GPUKIT_TEST_SKIP"} 2>&1) >"$logdir/$name.log"
	p=$(grep -acE '^--- PASS: ' "$logdir/$name.log" || true)
	f=$(grep -acE '^--- (FAIL|SKIP): ' "$logdir/$name.log" || true)
	if ! grep -aqE '^(ok|PASS)$' "$logdir/$name.log" && [ "$f" = 0 ]; then f=1; fi
	grep -aE '^(--- (PASS|FAIL|SKIP)|panic:|FAIL)' "$logdir/$name.log" | sed 's/^/   /'
	[ "$f" != 0 ] && grep -a -B2 -A20 -E '^--- (FAIL|SKIP)|panic:' "$logdir/$name.log" | head -80 | sed 's/^/   | /'
	pass=$((pass + p)) fail=$((fail + f))
done
echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
RUN
chmod +x "$stage/run.sh"
cp scripts/gpu-par.sh "$stage/par.sh"

tar -C "$stage" -cf - . | xz -T0 -9 >"$out/gpukit-gpu.tar.xz"
cat >"$out/run.sh" <<'RUN'
#!/usr/bin/env bash
# Unpacks the bundle next to this script into a temp dir and runs its run.sh
# (or, with an argument, that file inside the bundle: a script such as
# bench/run.sh, run with bash, or a binary such as bench/gpukit-poolbench,
# run as it is).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
dest=${GPUKIT_BUNDLE_DIR:-$(mktemp -d)}
tar -C "$dest" -xJf "$here/gpukit-gpu.tar.xz"
target=$dest/${1:-run.sh}
shift || true
if [ ! -f "$target" ]; then
	echo "run.sh: no ${target#"$dest"/} in the bundle" >&2
	exit 2
fi
if [ "$(head -c4 "$target" | tr -d '\000')" = $'\x7fELF' ]; then
	exec "$target" "$@"
fi
exec bash "$target" "$@"
RUN
chmod +x "$out/run.sh"
rm -rf "$stage"
echo "gpu bundle: $out/gpukit-gpu.tar.xz ($(du -h "$out/gpukit-gpu.tar.xz" | cut -f1), $n test binaries)"
