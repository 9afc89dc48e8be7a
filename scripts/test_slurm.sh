#!/usr/bin/env bash
# make test-slurm: bring up a single-node SLURM on this machine (scripts/local_slurm.sh), run the tests that
# submit to it for real (tests/test_slurm_real.py), take it down again. Skipped, with the reason and exit 0,
# where SLURM cannot be had: no root or passwordless sudo, packages not installable, daemons that do not start.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
export MM_SLURM_DIR=${MM_SLURM_DIR:-/tmp/minimodel-slurm-test}
export MM_SLURM_PORT=${MM_SLURM_PORT:-16827}

skip() { echo "test-slurm: SKIPPED: $*"; exit 0; }

if [ "$(id -u)" -eq 0 ]; then SUDO=(); elif sudo -n true 2>/dev/null; then SUDO=(sudo -n -E); else
  skip "starting slurmd needs root or passwordless sudo"
fi
if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v munged >/dev/null \
   || ! command -v sbatch >/dev/null; then
  echo "test-slurm: installing slurmctld slurmd slurm-client munge (Debian packages)"
  "${SUDO[@]}" scripts/local_slurm.sh install || skip "the SLURM packages could not be installed (see above)"
fi
"${SUDO[@]}" scripts/local_slurm.sh up || skip "the local SLURM daemons did not start (logs in $MM_SLURM_DIR)"
trap '"${SUDO[@]}" scripts/local_slurm.sh down' EXIT
export SLURM_CONF=$MM_SLURM_DIR/slurm.conf
"$PY" -m pytest -q -m slurm -p no:cacheprovider tests/test_slurm_real.py -rs "$@"
