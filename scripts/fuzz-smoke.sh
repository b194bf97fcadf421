#!/usr/bin/env bash
# fuzz-smoke.sh — a short run of every fuzz target in the repository.
#
# Finds every `func FuzzXxx(f *testing.F)` in the modules' _test.go files and
# runs each alone for FUZZTIME (default 3s) with `go test -fuzz`. New inputs
# the fuzzer finds interesting stay in Go's cache; a failing input is
# written to the package's testdata/fuzz/FuzzXxx/ (commit it with the fix:
# it then runs as a regular test case). Exits non-zero on the first failure.
set -euo pipefail
cd "$(dirname "$0")/.."
fuzztime=${FUZZTIME:-3s}
GO=${GO:-go}
n=0
log=$(mktemp)
trap 'rm -f "$log"' EXIT
while IFS=: read -r file name; do
	dir=$(dirname "$file")
	pkg=$(cd "$dir" && $GO list .)
	echo "fuzz-smoke: $pkg $name ($fuzztime)"
	(cd "$dir" && $GO test -run='^$' -fuzz="^${name}\$" -fuzztime="$fuzztime" .) >"$log" 2>&1 || {
		cat "$log"
		echo "fuzz-smoke: $pkg $name failed" >&2
		exit 1
	}
	n=$((n + 1))
done < <(grep -rhoE --include='*_test.go' '^func Fuzz[A-Za-z0-9_]*\(f \*testing\.F\)' --with-filename . |
	sed -E 's/^([^:]+):func (Fuzz[A-Za-z0-9_]*)\(.*/\1:\2/' | sort -u)
echo "fuzz-smoke: $n targets, $fuzztime each"
