#!/usr/bin/env bash
# bench/optim-all.sh — issue 13's whole GPU batch in one command, inside the
# GPU bundle (scripts/gpu-bundle.sh; BUNDLE_PKGS='libgpu/optim|libgpu/ops|optimizer|trainer'
# is enough), within BUDGET_S seconds (default 480: about 8 minutes on one
# H100), every part under a time limit and its results kept as it ends:
#
#   1. tests  the issue's GPU tests: libgpu/optim (every algorithm at
#             f32/TF32/bf16 against the host, SOAP's two checks, async ==
#             sync, PyTorch parity), libgpu/ops (the matroot, precond,
#             newtonschulz and kfac families; large roots; the Newton TF32
#             measurement), optimizer (service == in process) and trainer
#             (async roots and the service give the same GPT losses)
#   2. roots  bench/roots.sh: inverse 4th roots of order 1024, 4096 and
#             64×512 against torch.linalg.eigh, and the service's round trip
#   3. mlp    bench/optim-mlp.sh: K-FAC on the Fashion-MNIST MLP, epochs to
#             AdamW's final test accuracy (MLP_EPOCHS, default 5)
#   4. gpt    bench/optim-gpt.sh, SHORTER than the issue's recipe: the
#             shakespeare-char model and its other settings, but GPT_STEPS
#             (default 2000, not 5000) steps per run with the cosine
#             schedule over them, validation on 100 batches every 100 steps,
#             runs in the order adamw, muon, shampoo, soap, each limited to
#             a fair share of the time left (a run cut short says so and
#             the comparison uses what it reached)
#
# Results go to BENCH_OUT in at most five files (what a GPU machine's
# output folder can return): optim-all.jsonl (every result as a JSON line,
# each part's status line {"part": ..., "rc": ..., "wall_s": ...} and each
# test binary's {"part": "tests", "name": ..., "failed": [...]}),
# optim-gpt.png, summary.txt (the test verdicts and the tables' lines),
# logs.tar.gz (full test logs, trainer logs, every run's metrics.jsonl; no
# checkpoints) — rewritten after every part, so a batch killed midway keeps
# what it finished.
#
# usage: bench/optim-all.sh TEXT [FASHION_DIR]
#   TEXT         tinyshakespeare.txt (the GPT runs; also the GPU tests' GPT text)
#   FASHION_DIR  Fashion-MNIST's IDX files (default $GPUKIT_DATA_DIR, else
#                /usr/share/datasets/fashion-mnist)
#   BENCH_OUT=DIR  BUDGET_S=480  PARTS="tests roots mlp gpt"  GPT_STEPS=2000
#   MLP_EPOCHS=5  SHAMPOO_FLAGS=... (and the other optim-gpt.sh variables)
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
text=${1:?usage: bench/optim-all.sh TEXT [FASHION_DIR]}
fashion=${2:-${GPUKIT_DATA_DIR:-/usr/share/datasets/fashion-mnist}}
text=$(cd "$(dirname "$text")" && pwd)/$(basename "$text")
out=${BENCH_OUT:-$(mktemp -d)}
mkdir -p "$out"
work=$(mktemp -d)
mkdir -p "$work/tests"
export GPUKIT_REQUIRE_GPU=1 PYTHONUNBUFFERED=1
export GPUKIT_BIN=${GPUKIT_BIN:-$root/bin}
export PATH="$GPUKIT_BIN:$PATH"
export GPUKIT_TEXT=$text GPUKIT_DATA_DIR=$fashion
export GPUKIT_CACHE_DIR=${GPUKIT_CACHE_DIR:-$work/kernels} # kernels compiled once, for every part
parts=${PARTS:-tests roots mlp gpt}
budget=${BUDGET_S:-480}
t_start=$(date +%s)
jsonl=$out/optim-all.jsonl
: >"$jsonl"
: >"$out/summary.txt"

log() { echo "optim-all.sh: $*" >&2; echo "$*" >>"$out/summary.txt"; }
emit() { tee -a "$jsonl"; }
now() { date +%s; }
left() { echo $((budget - ($(now) - t_start))); }
# share CAP RESERVE: seconds for a step: CAP, or less when the budget left
# after RESERVE seconds kept for later parts is smaller (0: no time).
share() {
	local l=$(($(left) - $2))
	((l > $1)) && l=$1
	((l < 0)) && l=0
	echo "$l"
}
has() { [[ " $parts " == *" $1 "* ]]; }
# sync: the consolidated files in $out, after every part.
sync_out() {
	tar -C "$work" --exclude='*.safetensors' --exclude=kernels -czf "$out/logs.tar.gz.tmp" . 2>/dev/null &&
		mv "$out/logs.tar.gz.tmp" "$out/logs.tar.gz"
	[ -f "$work/gpt/optim-gpt.png" ] && cp "$work/gpt/optim-gpt.png" "$out/"
	return 0
}
# part NAME RC T0 LIMIT: the part's status line.
part_line() {
	echo "{\"part\": \"$1\", \"rc\": $2, \"wall_s\": $(($(now) - $3)), \"limit_s\": $4}" | emit >/dev/null
	log "$1: exit $2 after $(($(now) - $3)) s (limit $4 s)"
	sync_out
}

# Reserves: what the later parts get at least.
reserve_tests=0 reserve_roots=0 reserve_mlp=0
has roots && reserve_tests=$((reserve_tests + 80))
has mlp && reserve_tests=$((reserve_tests + 40)) reserve_roots=$((reserve_roots + 40))
has gpt && reserve_tests=$((reserve_tests + 150)) reserve_roots=$((reserve_roots + 150)) reserve_mlp=$((reserve_mlp + 150))

log "start: budget ${budget}s, parts: $parts, text $text, Fashion-MNIST $fashion, results in $out"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | sed 's/^/gpu: /' | tee -a "$out/summary.txt" >&2

# 1. Tests: one go test binary run per (package, pattern), in priority
# order, each limited to its cap and to what is left of the tests' time.
gotest() { # NAME BINARY PATTERN CAP DEADLINE
	local name=$1 bin=$root/tests/$2.test dir=$root/tests/$2.d re=$3 cap=$4 deadline=$5
	local lim=$((deadline - $(now)))
	((lim > cap)) && lim=$cap
	if [ ! -x "$bin" ]; then
		echo "{\"part\": \"tests\", \"name\": \"$name\", \"rc\": -1, \"error\": \"no $2.test in the bundle\"}" | emit >/dev/null
		log "tests $name: no $bin"
		return
	fi
	if ((lim < 5)); then
		echo "{\"part\": \"tests\", \"name\": \"$name\", \"rc\": -1, \"error\": \"no time left\"}" | emit >/dev/null
		log "tests $name: not run (no time left)"
		return
	fi
	local t0 rc
	t0=$(now)
	(cd "$dir" && timeout -s INT -k 10 "$lim" "$bin" -test.v -test.count=1 -test.timeout="$((lim > 15 ? lim - 5 : lim))s" -test.run "$re") \
		>"$work/tests/$name.log" 2>&1
	rc=$?
	python3 - "$name" "$work/tests/$name.log" "$rc" "$(($(now) - t0))" "$lim" <<'PY' | emit | python3 -c '
import json, sys
for l in sys.stdin:
    d = json.loads(l)
    print("tests %s: exit %d in %ss: %d passed, failed: %s" % (d["name"], d["rc"], d["wall_s"], len(d["passed"]), ", ".join(d["failed"]) or "none"))
' | tee -a "$out/summary.txt" >&2
import json, re, sys
name, path, rc, wall, lim = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
passed, failed, skipped = [], [], []
for l in open(path, errors="replace"):
    m = re.match(r"^\s*--- (PASS|FAIL|SKIP): (\S+)", l)
    if not m:
        continue
    top = not l.startswith(" ")
    if m[1] == "PASS" and top:
        passed.append(m[2])
    elif m[1] == "FAIL":
        failed.append(m[2])
    elif m[1] == "SKIP":
        skipped.append(m[2])
if rc != 0 and not failed:
    failed.append("(exit %d%s)" % (rc, ": time limit" if rc == 124 else ""))
print(json.dumps({"part": "tests", "name": name, "rc": rc, "wall_s": wall, "limit_s": lim,
                  "passed": passed, "failed": failed, "skipped": skipped}))
PY
}
if has tests; then
	t0=$(now)
	lim=$(share 260 "$reserve_tests")
	deadline=$((t0 + lim))
	gotest optim libgpu_optim '^(TestCUDAOptimizersMatchHost|TestCUDASOAPMatchesHost|TestCUDAAsyncZeroIsSync|TestTorchParity)$' 100 "$deadline"
	gotest ops-roots libgpu_ops '^(TestCUDAInverseRootLarge|TestCUDANewtonTF32|TestCUDAEighF64Agrees)$' 80 "$deadline"
	gotest ops-families libgpu_ops '^TestCUDAFamilies$/.*/.*/^(matroot|precond|newtonschulz|kfac)$' 60 "$deadline"
	gotest trainer trainer '^(TestGPUAsyncRootsSameLosses|TestGPUServiceSameLosses)$' 150 "$deadline"
	gotest optimizer optimizer '^TestGPUServiceMatchesInProcess$' 45 "$deadline"
	part_line tests 0 "$t0" "$lim"
fi

# 2. Inverse roots against torch.linalg.eigh, and the service's round trip.
if has roots; then
	t0=$(now)
	lim=$(share 180 "$reserve_roots")
	if ((lim >= 20)); then
		mkdir -p "$work/roots"
		BENCH_OUT=$work/roots BENCHTIME=${BENCHTIME:-5x} ROOTS_ITERS=${ROOTS_ITERS:-5} timeout -s TERM -k 10 "$lim" \
			bash "$here/roots.sh" >/dev/null 2>"$work/roots/roots.err"
		rc=$?
		[ -f "$work/roots/roots.jsonl" ] && cat "$work/roots/roots.jsonl" >>"$jsonl"
		if [ ! -s "$work/roots/roots.jsonl" ] && [ -s "$work/roots/roots-go.txt" ]; then
			cat "$work/roots/roots-go.txt" >>"$out/summary.txt" # cut before the table: the raw lines
		fi
		python3 - "$work/roots/roots.jsonl" <<'PY' >>"$out/summary.txt" 2>/dev/null
import json, sys
for l in open(sys.argv[1]):
    try:
        d = json.loads(l)
    except ValueError:
        print(l.strip()); continue
    if d.get("workload") == "inverse-root":
        print("root %-26s batch %2d n %4d releps %-6g %9s ms  over eigh %-7s rel_err %-9s resid %-9s failed %s" % (
            d["impl"], d["batch"], d["n"], d["releps"], d.get("ms"), d.get("over_torch_eigh"), d.get("rel_err"),
            d.get("resid"), d.get("failed")))
    else:
        print(l.strip())
PY
		part_line roots "$rc" "$t0" "$lim"
	else
		part_line roots -1 "$t0" "$lim"
	fi
fi

# 3. K-FAC on the Fashion-MNIST MLP.
if has mlp; then
	t0=$(now)
	lim=$(share 120 "$reserve_mlp")
	if ((lim >= 20)); then
		mkdir -p "$work/mlp"
		BENCH_OUT=$work/mlp EPOCHS=${MLP_EPOCHS:-5} DEVICE=${DEVICE:-cuda} timeout -s TERM -k 10 "$lim" bash "$here/optim-mlp.sh" "$fashion" \
			2>"$work/mlp/optim-mlp.err" | emit >/dev/null
		rc=$?
		if ! grep -q optim-mlp-summary "$work/mlp/optim-mlp.jsonl" 2>/dev/null; then
			# Cut short: the epochs each run finished.
			python3 - "$work/mlp" <<'PY' | emit >/dev/null
import json, os, sys
acc = {}
for run in ("adamw", "kfac"):
    p = os.path.join(sys.argv[1], run + ".jsonl")
    if os.path.exists(p):
        acc[run] = [json.loads(l)["test_accuracy"] for l in open(p) if '"test_accuracy"' in l]
a, k = acc.get("adamw", []), acc.get("kfac", [])
hit = next((i + 1 for i, x in enumerate(k) if a and x >= a[-1]), None)
print(json.dumps({"workload": "optim-mlp-summary", "cut": True, "adamw_accuracy": a, "kfac_accuracy": k,
                  "kfac_epochs_to_adamw": hit}))
PY
		fi
		grep -h '"optim-mlp' "$jsonl" >>"$out/summary.txt" 2>/dev/null
		part_line mlp "$rc" "$t0" "$lim"
	else
		part_line mlp -1 "$t0" "$lim"
	fi
fi

# 4. The GPT comparison, short: every run gets a fair share of what is left.
if has gpt; then
	t0=$(now)
	lim=$(share 100000 10)
	if ((lim >= 40)); then
		mkdir -p "$work/gpt"
		BENCH_OUT=$work/gpt STEPS=${GPT_STEPS:-2000} EVAL_EVERY=${EVAL_EVERY:-100} EVAL_BATCHES=${EVAL_BATCHES:-100} \
			OPTIMS=${OPTIMS:-adamw muon shampoo soap} DEADLINE=$((t0 + lim)) \
			bash "$here/optim-gpt.sh" "$text" 2>"$work/gpt/optim-gpt.err" | emit >/dev/null
		rc=$?
		grep -h 'optim-gpt-run\|steps_to_baseline\|optim-gpt-step' "$work/gpt/optim-gpt.jsonl" >>"$out/summary.txt" 2>/dev/null
		part_line gpt "$rc" "$t0" "$lim"
	else
		part_line gpt -1 "$t0" "$lim"
	fi
fi
log "done in $(($(now) - t_start)) s; results in $out"
sync_out
