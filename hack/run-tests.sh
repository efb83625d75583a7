#!/usr/bin/env bash
# The pytest part of `make test`: three pytest runs side by side, inside the test bed's network namespace.
#   heavy: tests/training and tests/e2e (real Horovod ranks and the real node: CPU-bound);
#   waits: the two GPU-build checks and the trainers' own file (test_training.py) of tests/training, the
#          integration files that mostly wait on the control plane's own timers (a node lost, staging,
#          faults) or on Kueue's controllers, against a local control plane of their own ($CLUSTER_NAME-b),
#          then the demo's playground (a real-node cluster of its own, in a network namespace of its own):
#          the heavy run is the longest, and this one ends first;
#   main:  every other tier (unit, Azurite, the rest of the integration tests), live.
# Alone, one run leaves the two cores idle much of the time (it waits on API servers and controllers); side
# by side the runs fill it. They share nothing but the namespace: each starts its own clusters, Azurite and
# temporary directories. The side runs log to files, printed whole once all have ended, so the logs never
# interleave. At the end hack/junit_summary.py sums every run (their JUnit reports) in one line and names
# every test that failed, skipped or xfailed; the exit code is the worst of the runs', or 1 where they all
# passed but a skip or xfail is not in tests/allowed-skips.toml.
#
#   hack/run-tests.sh PYTHON [PYTEST ARGS...]    (PYTEST ARGS go to every run)
set -uo pipefail
py=${1:?usage: $0 PYTHON [PYTEST ARGS...]}
shift
out=${DTJOB_TEST_OUT:-out/tests}
mkdir -p "$out"
rm -f "$out"/*.xml "$out"/*.log
base=$(mktemp -d "${TMPDIR:-/tmp}/dtjob-tests.XXXXXX")
cluster=${CLUSTER_NAME:-dtjob}

heavy=(tests/training tests/e2e)
# The trainers' tests that take ranks away stay in the heavy run: run beside its real-node tests, Horovod
# ranks slowed the node's training to 20 s a step, and the real-node tests that take a rank away mid-training
# failed. The waits run starts with the two GPU-build checks (venvs from the wheelhouse, the bench on CPU; no
# cluster) and test_training.py (two ranks on the host), which so end beside the heavy run's trainers' tests
# (it runs tests/training first) and the first real-node tests (image checks, no rank taken away).
waits=(tests/training/test_gpu_build.py tests/training/test_gpu_bench.py tests/training/test_training.py
  tests/integration/test_operator_node_lost.py tests/integration/test_operator_storage.py
  tests/integration/test_operator_faults.py tests/integration/test_kueue.py
  tests/integration/test_multikueue.py tests/e2e/test_demo_playground.py)

# The machine's CPU time (/proc/stat's first line: user nice system idle iowait irq softirq steal, in ticks),
# read before and after the runs: how busy the cores were says whether moving tests between runs can help
# (idle cores) or only fewer CPU seconds can (busy ones).
cpu_ticks() { awk '/^cpu /{print $2+$3+$4+$7+$8+$9, $5+$6; exit}' /proc/stat; }
read -r busy_before idle_before < <(cpu_ticks)

declare -A pid_of=()
cleanup() {
  local name
  for name in "${!pid_of[@]}"; do kill "${pid_of[$name]}" 2>/dev/null; done
  wait 2>/dev/null
  rm -rf "$base"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

side_run() { # NAME CLUSTER TESTS...: a pytest run in the background, logged to $out/NAME.log
  local name=$1 cluster_name=$2
  shift 2
  CLUSTER_NAME=$cluster_name "$py" -m pytest "$@" --basetemp="$base/$name" --junitxml="$out/$name.xml" \
    "${pytest_args[@]}" >"$out/$name.log" 2>&1 &
  pid_of[$name]=$!
  echo "[tests] $* run beside the tiers below ($out/$name.log, printed when all runs end)"
}

# An xfail-marked test that passes fails its run ([XPASS(strict)]): its mark no longer says what it does.
pytest_args=(-o xfail_strict=true "$@")
side_run heavy "$cluster" "${heavy[@]}" "${waits[@]/#/--ignore=}"
side_run waits "$cluster-b" "${waits[@]}"

declare -A rc_of=()
rc_of[main]=0
"$py" -m pytest tests "${heavy[@]/#/--ignore=}" "${waits[@]/#/--ignore=}" --basetemp="$base/main" \
  --junitxml="$out/main.xml" "${pytest_args[@]}" || rc_of[main]=$?
read -r busy_main idle_main < <(cpu_ticks)
for name in heavy waits; do
  rc_of[$name]=0
  wait "${pid_of[$name]}" || rc_of[$name]=$?
  unset "pid_of[$name]"
  echo
  echo "=============================== run beside: $name ==============================="
  cat "$out/$name.log"
done
read -r busy_end idle_end < <(cpu_ticks)
busy_share() { # BUSY_FROM IDLE_FROM BUSY_TO IDLE_TO: the percentage of the CPU time between them that was busy
  local busy=$(($3 - $1)) idle=$(($4 - $2))
  echo $((100 * busy / (busy + idle > 0 ? busy + idle : 1)))
}
echo "[tests] the cores were $(busy_share "$busy_before" "$idle_before" "$busy_main" "$idle_main")% busy" \
  "while the main run ran, $(busy_share "$busy_main" "$idle_main" "$busy_end" "$idle_end")% after it"
echo
# A green run means every test ran: a skip or xfail the allowed list does not name fails it too.
summary_rc=0
"$py" hack/junit_summary.py "$out/main.xml" "$out/heavy.xml" "$out/waits.xml" || summary_rc=$?
worst=0
for name in main heavy waits; do
  ((rc_of[$name] == 0)) && continue
  echo "[tests] the $name run exited ${rc_of[$name]}"
  ((worst == 0)) && worst=${rc_of[$name]}
done
if ((worst == 0 && summary_rc != 0)); then
  echo "[tests] every run exited 0, but the summary above names what did not run as it should"
  worst=$summary_rc
fi
# pytest's 5 (no tests collected) counts as a failure here: every run has tests.
exit "$worst"
