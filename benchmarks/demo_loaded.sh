#!/usr/bin/env bash
# The whole demo (`minimodel run experiments/demo.yaml`, from scratch: tokenizer, shards, all four systems) beside
# two busy processes, timed; docs/benchmarks.md "Threads under load".
#
#   bash benchmarks/demo_loaded.sh same|other OUT.txt
#
# same:  the two busy loops are children of this script: in the demo's own session (the kernel shares the CPU per
#        thread between them and the demo's stages).
# other: they are one job in a new session (setsid), as work started from another terminal, login or service is:
#        where autogroup is on (/proc/sys/kernel/sched_autogroup_enabled = 1) the kernel shares the CPU between
#        sessions first.
# Writes the start and end (uptime's load), the exit status, the elapsed seconds and each stage's thread choice to
# OUT.txt. Run it with nothing else running.
set -euo pipefail
where=${1:?same or other}
out=${2:?output file}
root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
hog='while True: pass'
if [ "$where" = same ]; then
  python3 -c "$hog" & h1=$!
  python3 -c "$hog" & h2=$!
  stop() { kill -9 "$h1" "$h2" 2>/dev/null || true; rm -rf "$work"; }
elif [ "$where" = other ]; then
  setsid sh -c "python3 -c '$hog' & python3 -c '$hog' & wait" & job=$!
  stop() { kill -9 -- "-$job" 2>/dev/null || true; rm -rf "$work"; }
else
  echo "demo_loaded.sh: the first argument is 'same' or 'other', not '$where'" >&2
  exit 2
fi
trap stop EXIT
sleep 2
echo "start $(date -u +%T)  $(uptime)" >"$out"
echo "autogroup: $(cat /proc/sys/kernel/sched_autogroup_enabled 2>/dev/null || echo unknown); commit $(git -C "$root" rev-parse --short HEAD)" >>"$out"
t0=$(date +%s)
rc=0
(cd "$root" && WANDB_MODE=disabled .venv/bin/minimodel run experiments/demo.yaml "runs_dir=$work/runs" \
  "data.prepared_dir=$work/prepared" --no-progress) >"$work/log" 2>&1 || rc=$?
t1=$(date +%s)
echo "rc=$rc elapsed=$((t1 - t0)) s end $(date -u +%T)  $(uptime)" >>"$out"
echo "command: two 'python3 -c \"$hog\"' ($where session) beside '.venv/bin/minimodel run experiments/demo.yaml runs_dir=TMP/runs data.prepared_dir=TMP/prepared --no-progress'" >>"$out"
echo "thread choice lines of the run's log:" >>"$out"
grep -c "CPU thread" "$work/log" >>"$out" || true
grep "CPU thread" "$work/log" | sort | uniq -c >>"$out" || true
tail -5 "$work/log" >>"$out"
exit "$rc"
