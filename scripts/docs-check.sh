#!/usr/bin/env bash
# docs-check.sh — runs the shell examples of README.md and TOOLS.md as
# written, on the CPU: every ```sh block, each in a fresh directory with
# the tools of $GPUKIT_BIN (./bin) on PATH, fails on the first command
# that fails. A command that cannot run here is skipped by name below,
# with the reason printed; a few get short-mode flags appended (listed
# below, as the Makefile's ci target shortens the pipelines), so the whole
# check takes a few minutes on two cores. `make ci` runs it (make
# docs-check alone).
#
# Environment: GPUKIT_BIN (./bin), DATA (Fashion-MNIST, as make deps
# installs it), TEXT (nanoGPT's tinyshakespeare.txt: ../shared/data's when
# there, else Newton's Opticks from Go's testdata), KEEP=1 keeps the work
# directory.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
bin=$(cd "${GPUKIT_BIN:-./bin}" && pwd)
for t in gpupool trainer sampler kernelc tracer optimizer; do
	[ -x "$bin/$t" ] || { echo "docs-check: $bin/$t not found (make build)" >&2; exit 1; }
done
command -v jq >/dev/null || { echo "docs-check: jq not found (make deps installs it)" >&2; exit 1; }
text=${TEXT:-}
if [ -z "$text" ]; then
	text=$root/../shared/data/tinyshakespeare.txt
	[ -f "$text" ] || text=$(go env GOROOT)/src/testdata/Isaac.Newton-Opticks.txt
fi
work=$(mktemp -d "${TMPDIR:-/tmp}/docs-check.XXXXXX")
[ "${KEEP:-0}" = 1 ] || trap 'rm -rf "$work"' EXIT

# skip LINE: the reason a command cannot run here, or nothing.
skip() {
	case $1 in
	"make test"*) echo "make ci runs every test" ;;
	"make demo"*) echo "runs examples/pipelines/train-fashion.sh in full (about a minute); make ci runs it in short mode, and the README's pipeline block runs its commands here" ;;
	"trainer launch"* | "srun "*) echo "data-parallel GPT training needs several GPUs (NCCL) and Slurm" ;;
	"kernelc build --arch"* | "kernelc build --libgpu"*)
		echo "compiles with NVRTC, on a GPU machine (kernelc's GPU tests and scripts run it there)" ;;
	"kernelc info saxpy.cubin"*) echo "reads the cubin the skipped line above compiles (kernelc's tests read cubins without a GPU)" ;;
	esac
}

# short LINE: flags appended to a command that takes long on a CPU.
short() {
	case $1 in
	"trainer run --pool"*) echo " --epochs 1 --limit 3000" ;; # as make ci's EPOCHS=1 LIMIT=3000
	"trainer run --model gpt"*) echo " --steps 2 --layers 1 --heads 2 --d-model 32 --block 32 --batch 4 --warmup 1 --eval-every 2 --eval-batches 1" ;;
	"trainer run --model moe"*) echo " --steps 2 --layers 2 --heads 2 --d-model 32 --block 32 --batch 4 --warmup 1 --eval-every 2 --eval-batches 1" ;;
	"trainer generate"*) echo " --tokens 20" ;;
	"trainer data sudoku"*) echo " --n 12 --test-n 4" ;;
	"trainer run --model hrm"*) echo " --steps 2 --batch 4 --hidden 32 --heads 2 --h-layers 1 --l-layers 1 --halt-max-steps 2 --num-aug 2 --eval-n 4" ;;
	"trainer eval --ckpt hrm/"*) echo " --n 4" ;;
	esac
}

# blocks FILE: each ```sh block as "START_LINE<TAB>logical line" records,
# backslash continuations joined, blank lines dropped, each block ended by
# a record whose line is \001.
blocks() {
	awk -v OFS='\t' '
		/^```sh$/ { inb = 1; start = NR; cur = ""; next }
		inb && /^```$/ { inb = 0; print start, "\001"; next }
		inb && /^[[:space:]]*$/ { next }
		inb {
			line = $0
			if (sub(/\\$/, "", line)) { cur = cur line; next }
			print start, cur line
			cur = ""
		}
	' "$1"
}

ran=0 skipped=0 n=0
for doc in README.md TOOLS.md; do
	script= start=
	while IFS=$'\t' read -r at line; do
		if [ "$line" = $'\001' ]; then
			# A block of comments only (all its commands skipped) runs nothing.
			if ! printf '%s' "$script" | grep -qv '^[[:space:]]*#'; then
				script=
				continue
			fi
			n=$((n + 1))
			dir=$work/block$n
			mkdir -p "$dir/run-xdg" && chmod 0700 "$dir/run-xdg"
			cp "$text" "$dir/tinyshakespeare.txt"
			head -c 100000 /dev/urandom >"$dir/w.bin"
			ln -s "$root/examples" "$dir/examples"
			echo "docs-check: $doc:$at"
			if ! (cd "$dir" && env PATH="$bin:$PATH" GPUKIT_BIN="$bin" XDG_RUNTIME_DIR="$dir/run-xdg" GPUKIT_POOL_SOCKET= \
				EPOCHS=1 LIMIT=3000 ${DATA:+DATA="$DATA"} sock="$dir/pool.sock" \
				bash -c 'set -euo pipefail; trap "kill \$(jobs -p) 2>/dev/null || true; wait || true" EXIT'$'\n'"$script" \
				>"$dir/out.log" 2>&1); then
				echo "docs-check: $doc:$at failed; its output:" >&2
				tail -40 "$dir/out.log" >&2
				exit 1
			fi
			script=
			continue
		fi
		cmd=${line#"${line%%[![:space:]]*}"}
		if why=$(skip "$cmd") && [ -n "$why" ]; then
			echo "docs-check:   skip: $cmd"
			echo "docs-check:         ($why)"
			skipped=$((skipped + 1))
			continue
		fi
		add=$(short "$cmd")
		if [ -n "$add" ]; then
			# Before a trailing comment, if any.
			case $line in
			*"  #"*) line="${line%%  #*}$add  #${line#*  #}" ;;
			*) line="$line$add" ;;
			esac
		fi
		script+="$line"$'\n'
		case $cmd in "#"*) ;; *) ran=$((ran + 1)) ;; esac
	done < <(blocks "$doc")
done
echo "docs-check: $ran commands in $n blocks ran as written (short-mode flags listed in this script), $skipped skipped with the reasons above"
