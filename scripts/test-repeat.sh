#!/usr/bin/env bash
# test-repeat.sh N: runs CI's entry point (.ci/run, which runs `make test`) N times in a row, each on a fresh
# clone of this repository's HEAD (as CI does), and lists every failure with its run, package and test name. For hunting flaky tests: a test
# that fails once in N runs is a defect.
#
#   scripts/test-repeat.sh 3          # or: make test-repeat N=3
#
# Logs stay in $TEST_REPEAT_DIR (default: a new directory under /tmp), one per run. Exit status 1 when any
# run failed.
set -uo pipefail
n="${1:-3}"
case "$n" in ''|*[!0-9]*) echo "test-repeat: N must be a whole number, got '$n'" >&2; exit 2 ;; esac
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${TEST_REPEAT_DIR:-$(mktemp -d /tmp/paygate-test-repeat.XXXXXX)}"
mkdir -p "$out"
failed=0
summary=()
for i in $(seq 1 "$n"); do
  clone="$out/clone-$i"
  rm -rf "$clone"
  git clone -q "$root" "$clone"
  start=$(date +%s)
  echo "run $i/$n: bash .ci/run in $clone (log: $out/run-$i.log)"
  (cd "$clone" && bash .ci/run) >"$out/run-$i.log" 2>&1
  status=$?
  took=$(( $(date +%s) - start ))
  if [ "$status" -eq 0 ]; then
    summary+=("run $i: pass (${took}s)")
  else
    failed=1
    summary+=("run $i: FAIL (${took}s, exit $status)")
    # Test failures by name (subtests too), then failing packages and build errors.
    while IFS= read -r line; do summary+=("    $line"); done < <(
      grep -E -e '^\s*--- FAIL: ' -e '^FAIL\s' -e '^panic: ' -e 'gofmt needed' -e '^make(\[[0-9]+\])?: \*\*\*' "$out/run-$i.log" | sed -E 's/^\s+//' | sort -u)
  fi
  rm -rf "$clone"
done
echo
echo "test-repeat: $n runs of .ci/run (logs in $out)"
printf '%s\n' "${summary[@]}"
exit "$failed"
