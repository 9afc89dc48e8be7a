#!/usr/bin/env bash
# The wheels scripts/device_gpu_check.sh installs on a lent GPU machine that reaches no registry: what minimodel
# imports and that machine lacks (omegaconf; its one need, PyYAML, is there), for its Python 3.12, at the version
# this checkout's .venv runs, into .whl/ (git-ignored; the device call carries it: carry [".whl"]). Run here, once.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
version=$("$PY" -c "import importlib.metadata as m; print(m.version('omegaconf'))")
mkdir -p .whl
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d .whl "omegaconf==$version"
ls -l .whl
