#!/usr/bin/env bash
# bench/attention-kernels.sh — what a GPU machine says about the attention
# kernels on wgmma (issue 25), in one go:
#
#   resources  per instance: ptxas's registers at launch and stack, the
#              SASS's instructions and local loads/stores (spills)
#              (kernelc build --arch sm_90a, cuobjdump); KERNELS lists them
#   paths      the forward on every kernel path (BenchmarkAttentionForwardPaths:
#              mma.sync, wgmma, ws, ws-persistent, ws-c3, ws-c3-persistent;
#              BenchmarkAttentionForwardWide: D = 256),
#              and the backward and its passes on wgmma and warp-specialised
#              (BenchmarkAttentionBackwardPaths, ...DKDV, ...DQ,
#              ...BackwardWS), ms a call, the median of CUDA events
#   ncu        (NCU=1) Nsight Compute's speed of light, warp states and
#              instruction counts of the first timed launch of the kernels
#              matching NCU_KERNEL (a regex, default attn_fwd_ws) in
#              benchmark NCU_BENCH (default BenchmarkAttentionForwardPaths)
#              on each path of NCU_PATHS at NCU_SHAPE (default: the
#              persistent and non-persistent forward at non-causal
#              (2,16,8192,128)); e.g. the dK/dV passes at D = 128:
#              NCU_BENCH=BenchmarkAttentionBackwardDKDV NCU_PATHS=wgmma
#              NCU_KERNEL=attn_bwd_dkdv NCU_SHAPE=B8,H16,T2048,D128,noncausal
#
# A changed attention.cu is measured without rebuilding: point
# GPUKIT_KERNEL_SRC at the directory holding it (the resources read it too).
# Output: text on stdout, and everything in $BENCH_OUT when set.
#
# usage: bench/attention-kernels.sh   (inside the GPU bundle: bin/kernelc,
#        tests/libgpu_ops.test, bench/kernels/)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
out=${BENCH_OUT:-$(mktemp -d)}
mkdir -p "$out"
t=$root/tests/libgpu_ops.test
kc=$root/bin/kernelc
[ -x "$t" ] && [ -x "$kc" ] || { echo "bench/attention-kernels.sh: run it inside the GPU bundle (no $t or $kc)" >&2; exit 2; }
src=${GPUKIT_KERNEL_SRC:-$here/kernels}
[ -f "$src/attention.cu" ] || src=$here/kernels
export GPUKIT_REQUIRE_GPU=1
kernels=${KERNELS:-attn_fwd_ws_d128 attn_fwd_ws_pers_d128 attn_fwd_ws_d64 attn_fwd_ws_pers_d64 attn_fwd_ws_c3_d64 attn_fwd_ws_c3_pers_d64 attn_fwd_ws_drop_d128 attn_fwd_wg_d128 attn_bwd_dkdv_wg_d128 attn_bwd_dkdv_ws_d128 attn_bwd_dq_wg_d128 attn_bwd_dq_ws_d128 attn_bwd_dkdv_ws_d64 attn_bwd_dq_ws_d64 attn_fwd_ws_d256 attn_bwd_dkdv_ws_drop_d128 attn_bwd_dq_ws_drop_d128}

echo "== resources ($src/attention.cu)"
work=$(mktemp -d)
for k in $kernels; do
	(
		"$kc" build --arch sm_90a --no-cache -I "$here/kernels" -D "GPUKIT_ONLY=$k" -o "$work/$k.cubin" "$src/attention.cu" >"$work/$k.log" 2>&1 || { echo "$k: kernelc failed: $(tail -1 "$work/$k.log")"; exit 0; }
		cuobjdump -sass "$work/$k.cubin" >"$work/$k.sass" || true
		res=$(cuobjdump -res-usage "$work/$k.cubin" | grep -A1 -E "Function $k:?\$" | tail -1 | awk '{print $1, $2}') || true
		grep C75 "$work/$k.log" | sort -u >"$out/ptxas-warnings-$k.txt" || true
		awk -v fn="$k" -v res="$res" -v warn="$(grep -c C75 "$work/$k.log" || true)" '
			/Function : / { on = ($3 == fn) }
			on && /^[ \t]+\/\*[0-9a-f]+\*\/ / { n++; if ($0 ~ /STL|LDL/) spill++ }
			END { printf "%-28s %s instructions=%d local-ld/st=%d ptxas-C75xx=%d\n", fn, res, n, spill, warn }' "$work/$k.sass"
	) &
done | sort | tee "$out/attention-resources.txt"
wait
# ptxas's C75xx warnings name why it serialised wgmma (the registers the
# pipeline needed, a call, ...): one such kernel loses its overlap.
for f in "$out"/ptxas-warnings-*.txt; do
	if [ -s "$f" ]; then
		echo "-- ${f##*/ptxas-warnings-}"
		cut -c1-240 "$f"
	fi
done

echo "== paths (ms a call)"
(cd "$root/tests/libgpu_ops.d" && "$t" -test.run '^$' \
	-test.bench '^BenchmarkAttention(ForwardPaths|ForwardWide|BackwardPaths|BackwardDKDV|BackwardDQ|BackwardWS|ForwardBackwardDropout)$' \
	-test.benchtime "${GPUKIT_BENCH_TIME:-20x}") | tee "$out/attention-paths.txt" |
	awk '/^Benchmark/ { for (i = 1; i < NF; i++) if ($(i + 1) == "ms/call") print $1, $i }'

if [ "${NCU:-0}" = 1 ]; then
	shape=${NCU_SHAPE:-B2,H16,T8192,D128,noncausal}
	bench=${NCU_BENCH:-BenchmarkAttentionForwardPaths}
	for p in ${NCU_PATHS:-ws ws-persistent}; do
		echo "== ncu $p/$shape"
		(cd "$root/tests/libgpu_ops.d" && ncu --section SpeedOfLight --section WarpStateStats --section InstructionStats \
			--section ComputeWorkloadAnalysis --kernel-name "regex:${NCU_KERNEL:-attn_fwd_ws}" --launch-skip 4 --launch-count 1 \
			"$t" -test.run '^$' -test.bench "^$bench\$/^$p\$/^$shape\$" -test.benchtime 5x) \
			>"$out/ncu-$p.txt" 2>&1 || true
		grep -E 'Duration|Executed Instructions |Warp Cycles Per Issued|Issue Slots Busy|Compute \(SM\) Throughput|Memory Throughput' "$out/ncu-$p.txt" || tail -5 "$out/ncu-$p.txt"
	done
fi
echo "bench/attention-kernels.sh: results in $out"
