#!/usr/bin/env bash
# The integration and e2e tests as `make test` runs them: two pytest processes at once.
#
# The tests that use Ray or `etrain serve` run one at a time in one process (they share a
# Ray cluster and served apps). They leave a core idle much of the time: processes
# starting, nodes and heads coming and going, polls. The tests marked `no_ray` (local gloo
# tables, files, servers on loopback; CPU-bound, and nothing in them is timed) run in a
# second process beside them at the lowest priority, on the CPU the Ray tests leave: nice
# 19, below Ray's own worker processes (the raylet starts them at nice 15). At nice 10 they
# ran ahead of the Ray jobs' workers, and some Ray tests that ran meanwhile took twice
# as long (test_elastic 138 s against 86 s alone).
# Its output is printed when both are done; either failing fails the run.
set -u
PYTEST=${PYTEST:-.venv/bin/pytest}
log=$(mktemp -t etrain-no-ray-XXXXXX.log)
start=$(date +%s)
nice -n 19 "$PYTEST" -q -p no:cacheprovider -m no_ray --durations=10 "$@" tests/integration \
  > "$log" 2>&1 &
beside=$!
"$PYTEST" -q -m "not no_ray" --durations=30 "$@" tests/integration tests/e2e
ray_rc=$?
wait "$beside"
beside_rc=$?
echo "---- the no_ray tests, run beside (exit $beside_rc) ----"
cat "$log"
rm -f "$log"
echo "integration and e2e: $(($(date +%s) - start)) s of wall time, both processes"
[ "$ray_rc" -eq 0 ] && [ "$beside_rc" -eq 0 ]
