#!/usr/bin/env bash
# A single-node SLURM on this machine (localhost), to try `minimodel submit` without a cluster and for
# `make test-slurm`.
#
#   scripts/local_slurm.sh install   # Debian/Ubuntu: apt-get install slurmctld slurmd slurm-client munge
#   scripts/local_slurm.sh up        # start munged, slurmctld and slurmd (needs root: slurmd runs jobs as their user)
#   export SLURM_CONF=/tmp/minimodel-slurm/slurm.conf   # `up` prints this line: sbatch, squeue, ... read it
#   scripts/local_slurm.sh status    # sinfo + squeue
#   scripts/local_slurm.sh down      # stop the three daemons (by the pids they wrote)
#
# Everything lives in $MM_SLURM_DIR (default /tmp/minimodel-slurm): slurm.conf, a munge key and socket of its
# own (the system's munge is left alone), state, logs, pid files. The node is this host with all its CPUs
# (at least 4 declared, so jobs asking for a few CPUs run on a small machine too), no GPUs, partition
# `debug`; JobRequeue=1 so that `scontrol requeue` works as on a real cluster.
set -euo pipefail

DIR=${MM_SLURM_DIR:-/tmp/minimodel-slurm}
CONF=$DIR/slurm.conf
HOST=$(hostname -s)

die() { echo "local_slurm: $*" >&2; exit 1; }

need_root() {
  [ "$(id -u)" -eq 0 ] || die "$1 needs root (slurmd starts jobs as their user): run it with sudo"
}

cmd_install() {
  need_root install
  command -v apt-get >/dev/null || die "apt-get not found: install slurmctld, slurmd, slurm-client and munge with your package manager"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurmctld slurmd slurm-client munge >/dev/null
}

pid_alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

write_conf() {
  local cpus mem
  cpus=$(nproc); [ "$cpus" -lt 4 ] && cpus=4
  mem=$(awk '/MemTotal/ {print int($2 / 1024)}' /proc/meminfo)
  cat > "$CONF" <<CONF
# written by scripts/local_slurm.sh: a single-node SLURM on localhost
ClusterName=minimodel-local
SlurmctldHost=$HOST(127.0.0.1)
SlurmUser=root
SlurmctldPort=${MM_SLURM_PORT:-16817}
SlurmdPort=$(( ${MM_SLURM_PORT:-16817} + 1 ))
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$DIR/munge/munge.socket
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.pid
SlurmctldLogFile=$DIR/slurmctld.log
SlurmdLogFile=$DIR/slurmd.log
SlurmdParameters=config_overrides
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
JobRequeue=1
ReturnToService=2
KillWait=10
MinJobAge=600
SchedulerParameters=defer_batch
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
NodeName=$HOST NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=$HOST Default=YES MaxTime=INFINITE State=UP
CONF
}

cmd_up() {
  need_root up
  for b in munged mungekey slurmctld slurmd sbatch; do
    command -v "$b" >/dev/null || die "$b not found: run \`scripts/local_slurm.sh install\` (Debian/Ubuntu) first"
  done
  if pid_alive "$DIR/slurmctld.pid" && pid_alive "$DIR/slurmd.pid"; then
    echo "local_slurm: already up ($DIR)"; echo "export SLURM_CONF=$CONF"; return
  fi
  mkdir -p "$DIR"/{state,spool,munge}
  chmod 700 "$DIR/munge"
  [ -f "$DIR/munge/munge.key" ] || mungekey --create --keyfile="$DIR/munge/munge.key" 2>/dev/null \
    || { dd if=/dev/urandom of="$DIR/munge/munge.key" bs=1 count=1024 status=none; }
  chmod 600 "$DIR/munge/munge.key"
  write_conf
  pid_alive "$DIR/munge/munged.pid" || munged --force --key-file="$DIR/munge/munge.key" \
    --socket="$DIR/munge/munge.socket" --pid-file="$DIR/munge/munged.pid" --log-file="$DIR/munge/munged.log" \
    --seed-file="$DIR/munge/munged.seed"
  export SLURM_CONF=$CONF
  pid_alive "$DIR/slurmctld.pid" || slurmctld -f "$CONF" -i
  pid_alive "$DIR/slurmd.pid" || slurmd -f "$CONF" -N "$HOST"
  for _ in $(seq 1 60); do  # until the node takes jobs
    if sinfo -h -N -o '%T' 2>/dev/null | grep -qE '^(idle|mixed|allocated)'; then
      echo "local_slurm: up ($DIR; node $HOST, partition debug)"; echo "export SLURM_CONF=$CONF"; return
    fi
    sleep 1
  done
  echo "local_slurm: the node did not become idle in 60 s; logs: $DIR/slurmctld.log $DIR/slurmd.log" >&2
  tail -5 "$DIR/slurmctld.log" "$DIR/slurmd.log" >&2 || true
  cmd_down; exit 1
}

cmd_down() {
  local f
  for f in "$DIR/slurmd.pid" "$DIR/slurmctld.pid" "$DIR/munge/munged.pid"; do
    if pid_alive "$f"; then
      kill "$(cat "$f")" || true
      for _ in $(seq 1 20); do pid_alive "$f" || break; sleep 0.5; done
      pid_alive "$f" && kill -9 "$(cat "$f")" 2>/dev/null || true
    fi
    rm -f "$f"
  done
  echo "local_slurm: down"
}

cmd_status() {
  export SLURM_CONF=$CONF
  sinfo; squeue
}

case "${1:-}" in
  install) cmd_install ;;
  up) cmd_up ;;
  down) cmd_down ;;
  status) cmd_status ;;
  *) echo "usage: $0 install|up|down|status" >&2; exit 2 ;;
esac
