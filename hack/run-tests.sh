#!/usr/bin/env bash
# The pytest part of `make test`: two pytest runs side by side, inside the test bed's network namespace.
#   heavy: tests/training and tests/e2e (real Horovod ranks and the real node: CPU-bound), logged to a file
#          and printed whole when both have ended, so the two logs never interleave;
#   light: every other tier (unit, Azurite, the real control plane: mostly waiting on API servers), live.
# Alone, the light tiers leave the two cores idle about half of the time, and the heavy ones fill it. They
# share nothing but the namespace: each tier starts its own clusters, Azurite and temporary directories.
# At the end, one line sums both runs (their JUnit reports); the exit code is the worse of the two.
#
#   hack/run-tests.sh PYTHON [PYTEST ARGS...]    (PYTEST ARGS go to both runs)
set -uo pipefail
py=${1:?usage: $0 PYTHON [PYTEST ARGS...]}
shift
out=${DTJOB_TEST_OUT:-out/tests}
mkdir -p "$out"
base=$(mktemp -d "${TMPDIR:-/tmp}/dtjob-tests.XXXXXX")
heavy_pid=""
cleanup() {
  [[ -n $heavy_pid ]] && kill "$heavy_pid" 2>/dev/null && wait "$heavy_pid" 2>/dev/null
  rm -rf "$base"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

heavy=(tests/training tests/e2e)
"$py" -m pytest "${heavy[@]}" --basetemp="$base/heavy" --junitxml="$out/heavy.xml" "$@" >"$out/heavy.log" 2>&1 &
heavy_pid=$!
echo "[tests] ${heavy[*]} run beside the tiers below; their log ($out/heavy.log) follows when both end"

light_rc=0
"$py" -m pytest tests "${heavy[@]/#/--ignore=}" --basetemp="$base/light" --junitxml="$out/light.xml" "$@" ||
  light_rc=$?
heavy_rc=0
wait "$heavy_pid" || heavy_rc=$?
heavy_pid=""
echo
echo "=============================== ${heavy[*]} (ran beside) ==============================="
cat "$out/heavy.log"
echo
"$py" - "$out/light.xml" "$out/heavy.xml" <<'PY'
import sys
import xml.etree.ElementTree as ET

totals = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
for path in sys.argv[1:]:
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError) as err:
        print(f"[tests] no report in {path}: {err}")
        continue
    for suite in root.iter("testsuite"):
        for key in totals:
            totals[key] += int(suite.get(key, 0))
failed = totals["failures"] + totals["errors"]
passed = totals["tests"] - failed - totals["skipped"]
print(f"both runs: {passed} passed, {failed} failed, {totals['skipped']} skipped")
PY
# pytest's 5 (no tests collected) is a failure here: every tier has tests.
((light_rc == 0 && heavy_rc == 0)) && exit 0
echo "[tests] light tiers exit $light_rc, ${heavy[*]} exit $heavy_rc"
exit $((light_rc != 0 ? light_rc : heavy_rc))
