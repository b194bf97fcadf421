#!/usr/bin/env bash
# fuzz-smoke.sh — a short run of every fuzz target in the repository.
#
# Finds every `func FuzzXxx(f *testing.F)` in the modules' _test.go files and
# runs each alone for FUZZTIME executions (default 50000x, a few seconds per
# target here) with `go test -fuzz`. The budget is a count, not a duration: a
# duration's deadline races the fuzzing coordinator's shutdown, and under load
# a target then fails with a bare "context deadline exceeded" and no failing
# input (golang/go#75804; it failed CI once, in FuzzParseAct). A count has no
# deadline to race; -timeout still bounds a target that hangs. New inputs
# the fuzzer finds interesting stay in Go's cache; a failing input is
# written to the package's testdata/fuzz/FuzzXxx/ (commit it with the fix:
# it then runs as a regular test case). Exits non-zero on the first failure.
set -euo pipefail
cd "$(dirname "$0")/.."
fuzztime=${FUZZTIME:-50000x}
GO=${GO:-go}
n=0
log=$(mktemp)
trap 'rm -f "$log"' EXIT
while IFS=: read -r file name; do
	dir=$(dirname "$file")
	pkg=$(cd "$dir" && $GO list .)
	echo "fuzz-smoke: $pkg $name ($fuzztime)"
	(cd "$dir" && $GO test -run='^$' -fuzz="^${name}\$" -fuzztime="$fuzztime" -timeout=5m .) >"$log" 2>&1 || {
		cat "$log"
		echo "fuzz-smoke: $pkg $name failed" >&2
		exit 1
	}
	n=$((n + 1))
done < <(grep -rhoE --include='*_test.go' '^func Fuzz[A-Za-z0-9_]*\(f \*testing\.F\)' --with-filename . |
	sed -E 's/^([^:]+):func (Fuzz[A-Za-z0-9_]*)\(.*/\1:\2/' | sort -u)
echo "fuzz-smoke: $n targets, $fuzztime each"
