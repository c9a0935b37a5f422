#!/usr/bin/env bash
# Run the model test (tests/model/test_model.py, SQLite and PostgreSQL) again and again with
# fresh random seeds (each process a soak of SOAK minutes) for about MINUTES minutes in all,
# and count the runs that Hypothesis found drawing differently on a replay
# (FlakyStrategyDefinition). Usage: tests/model/stress_draws.sh [REPO] [MINUTES] [SOAK]
set -u
repo=${1:-.}
minutes=${2:-5}
soak=${3:-1}
cd "$repo" || exit 2
log=$(mktemp -d /tmp/stress-draws.XXXXXX)
end=$(( $(date +%s) + minutes * 60 ))
runs=0 flaky=0 failed=0
while [ "$(date +%s)" -lt "$end" ]; do
  runs=$((runs + 1))
  out="$log/run-$runs.log"
  OUTBOX_SOAK_MINUTES=$soak .venv/bin/python -m pytest -q -p no:cacheprovider \
    ${STRESS_TEST:-tests/model/test_model.py} >"$out" 2>&1
  rc=$?
  n=$(grep -c "FlakyStrategyDefinition" "$out")
  [ "$n" -gt 0 ] && flaky=$((flaky + 1))
  [ "$rc" -ne 0 ] && failed=$((failed + 1))
  echo "run $runs: exit $rc, FlakyStrategyDefinition lines $n ($out)"
done
echo "stress in $(pwd): $runs run(s), $failed failed, $flaky with FlakyStrategyDefinition (logs $log)"
