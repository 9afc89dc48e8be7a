#!/usr/bin/env bash
# The whole demo (`minimodel run experiments/demo.yaml`, from scratch: tokenizer, shards, all four systems) idle or
# beside two busy processes, timed; docs/benchmarks.md "Threads under load".
#
#   bash benchmarks/demo_loaded.sh idle|same|other OUT.txt
#
# idle:  nothing beside it (the baseline: run it back to back with a loaded run).
# same:  the two busy loops are children of this script: in the demo's own session (the kernel shares the CPU per
#        thread between them and the demo's stages).
# other: they are one job in a new session (setsid), as a job started from another terminal is: where autogroup
#        is on (/proc/sys/kernel/sched_autogroup_enabled = 1) and nothing else puts the processes in cgroups of
#        their own, the kernel shares the CPU between sessions first.
# Writes the start and end (uptime's load), the exit status, the elapsed seconds and each stage's thread choice to
# OUT.txt. Run it with nothing else running.
set -euo pipefail
where=${1:?idle, same or other}
out=${2:?output file}
case "$where" in idle | same | other) ;; *)
  echo "demo_loaded.sh: the first argument is 'idle', 'same' or 'other', not '$where'" >&2
  exit 2
  ;;
esac
root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
hog='while True: pass'
if [ "$where" = idle ]; then
  stop() { rm -rf "$work"; }
elif [ "$where" = same ]; then
  python3 -c "$hog" & h1=$!
  python3 -c "$hog" & h2=$!
  stop() { kill -9 "$h1" "$h2" 2>/dev/null || true; rm -rf "$work"; }
else # other
  # the job writes its own pid (= its session and process group, whether or not setsid forked) before it starts
  setsid sh -c "echo \$\$ >'$work/job.pid'; python3 -c '$hog' & python3 -c '$hog' & wait" &
  for _ in 1 2 3 4 5 6 7 8 9 10; do [ -s "$work/job.pid" ] && break; sleep 0.2; done
  job=$(cat "$work/job.pid")
  stop() { kill -9 -- "-$job" 2>/dev/null || true; rm -rf "$work"; }
fi
trap stop EXIT
[ "$where" = idle ] || sleep 2
echo "start $(date -u +%T)  $(uptime)" >"$out"
echo "autogroup: $(cat /proc/sys/kernel/sched_autogroup_enabled 2>/dev/null || echo unknown); commit $(git -C "$root" describe --always --dirty)" >>"$out"
if [ "$where" = other ]; then
  echo "autogroups: demo's $(cat /proc/self/autogroup 2>/dev/null), the busy job's $(cat "/proc/$job/autogroup" 2>/dev/null)" >>"$out"
fi
t0=$(date +%s)
rc=0
(cd "$root" && WANDB_MODE=disabled .venv/bin/minimodel run experiments/demo.yaml "runs_dir=$work/runs" \
  "data.prepared_dir=$work/prepared" --no-progress) >"$work/log" 2>&1 || rc=$?
t1=$(date +%s)
echo "rc=$rc elapsed=$((t1 - t0)) s end $(date -u +%T)  $(uptime)" >>"$out"
echo "command: $where (idle: nothing; same/other: two 'python3 -c \"$hog\"' in the demo's session or another) beside '.venv/bin/minimodel run experiments/demo.yaml runs_dir=TMP/runs data.prepared_dir=TMP/prepared --no-progress'" >>"$out"
echo "thread choice lines of the run's log:" >>"$out"
grep -c "CPU thread" "$work/log" >>"$out" || true
grep "CPU thread" "$work/log" | sort | uniq -c >>"$out" || true
tail -5 "$work/log" >>"$out"
exit "$rc"
