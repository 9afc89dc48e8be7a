#!/usr/bin/env bash
# `make gpu-check` on a lent GPU machine that cannot install anything (this workplace's device tool: PyTorch,
# Lightning, torchmetrics, sentencepiece, transformers are there, omegaconf is not, and no registry is reachable).
# Here, once: bash scripts/device_wheels.sh (omegaconf's wheel into .whl/, git-ignored). There, in one call:
#     device run, carry [".whl"], timeout_s 560:  bash scripts/device_gpu_check.sh
# It installs the carried wheels into $SITE, puts them and this checkout on PYTHONPATH (minimodel runs from the
# tree, not installed), records nvidia-smi and the versions it runs with, then runs scripts/gpu_check.py with a time
# budget (BUDGET_S, default 480 s: the JSON is written after every check, so a call stopped at its limit still
# brings back what was measured). Everything lands in $OUT (the device tool brings back at most 8 files):
# nvidia-smi.txt, versions.txt, gpu_check.json, gpu_check.log, logs/{chain,resume,bench}.log.
# Then here: copy $OUT's gpu_check.json to benchmarks/results/gpu_check.json and commit it, whatever it says.
# Exit: gpu_check.py's (0 every check ok; 1 a check failed, was cut short or not run; 2 torch finds no CUDA device,
# which on a lent GPU machine is a failure); 3 the wheels do not install; 4 no Python with torch, or minimodel cannot
# be imported (a wheel missing).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-}
if [ -z "$PY" ]; then  # the interpreter that holds torch (python3 on this workplace's machines)
  for candidate in python3 python; do
    if command -v "$candidate" > /dev/null && "$candidate" -c "import torch" 2> /dev/null; then
      PY=$candidate
      break
    fi
  done
fi
if [ -z "$PY" ]; then
  echo "device-gpu-check: no python3 or python here imports torch (set PYTHON=...)" >&2
  exit 4
fi
WHEELS=${WHEELS:-.whl}
SITE=${SITE:-/tmp/site}
BUDGET_S=${BUDGET_S:-480}
: "${OUT:?OUT: the folder to write into (the device tool sets it)}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 WANDB_MODE=disabled
if compgen -G "$WHEELS/*.whl" > /dev/null; then
  installed=1
  if "$PY" -m pip --version > /dev/null 2>&1; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
      "$WHEELS"/*.whl || installed=0
  else  # no pip there: a pure-Python wheel is a zip of what goes into site-packages
    mkdir -p "$SITE" || installed=0
    for w in "$WHEELS"/*.whl; do "$PY" -m zipfile -e "$w" "$SITE" || installed=0; done
  fi
  if [ "$installed" = 0 ]; then
    echo "device-gpu-check: the wheels in $WHEELS did not install into $SITE" >&2
    exit 3
  fi
  export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}"
else
  echo "device-gpu-check: no wheels in $WHEELS (bash scripts/device_wheels.sh here, then carry it); going on" >&2
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
{ nvidia-smi || echo "nvidia-smi: not found or failed"; } > "$OUT/nvidia-smi.txt" 2>&1
if ! "$PY" -c "import minimodel.cli" 2> "$OUT/import.txt"; then
  echo "device-gpu-check: minimodel cannot be imported with $PY ($(tail -n 1 "$OUT/import.txt")): a wheel missing?" >&2
  exit 4
fi
rm -f "$OUT/import.txt"
"$PY" - <<'PYEOF' 2>&1 | tee "$OUT/versions.txt"
import importlib
import sys

print("python", sys.version.split()[0], sys.executable)
for name in ("torch", "lightning", "torchmetrics", "omegaconf", "sentencepiece", "numpy", "transformers",
             "minimodel.cli"):
    try:
        module = importlib.import_module(name)
        print(name, getattr(module, "__version__", "ok"), getattr(module, "__file__", ""))
    except Exception as e:  # noqa: BLE001 - said, and gpu_check.py then fails where it needs it
        print(name, "MISSING:", type(e).__name__, e)
try:
    import torch

    print("cuda", torch.version.cuda, "available", torch.cuda.is_available(),
          torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")
except Exception as e:  # noqa: BLE001
    print("cuda: cannot ask torch:", e)
PYEOF
"$PY" scripts/gpu_check.py --require-cuda --budget-s "$BUDGET_S" --out "$OUT/gpu_check.json" --logs "$OUT/logs" 2>&1 \
  | tee "$OUT/gpu_check.log"
rc=${PIPESTATUS[0]}
echo "device-gpu-check: scripts/gpu_check.py exit $rc"
exit "$rc"
