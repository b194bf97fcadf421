# bench/hrm-common.sh — what bench/hrm.sh and bench/hrm-quality.sh share,
# sourced by both: the tree's paths (root, bin, out, ref, work), the
# device flags of both sides (gdev: the trainer's, pdev: hrm.py's, for
# DEVICE=cuda or cpu; arch from ARCH), and tag.
here=$(cd "$(dirname "${BASH_SOURCE[1]}")" && pwd)
root=$(cd "$here/.." && pwd)
bin=${GPUKIT_BIN:-$root/bin}
out=${BENCH_OUT:-$(mktemp -d)}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
ref=$root/bench/reference/hrm.py
work=$(mktemp -d)
device=${DEVICE:-cuda}
read -r -a arch <<<"${ARCH:-}"
gdev=(--device cuda --precision bf16 --graph on) pdev=(--device cuda --dtype bf16)
if [ "$device" = cpu ]; then gdev=(--device host) pdev=(--device cpu --dtype f32); fi

# tag PART FILE: adds "part" to every JSON line of stdin and writes it to
# stdout and appends it to FILE; other lines go to stderr.
tag() {
	python3 -c '
import json, sys
out = open(sys.argv[2], "a")
for l in sys.stdin:
    try:
        d = json.loads(l)
    except ValueError:
        sys.stderr.write(l)
        continue
    s = json.dumps(dict(part=sys.argv[1], **d))
    print(s, flush=True)
    print(s, file=out, flush=True)' "$1" "$2"
}
