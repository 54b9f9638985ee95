#!/usr/bin/env bash
# Makes the venv of one peer (a library braid is checked against, never one braid depends
# on) and prints its python:
#     bash scripts/peer_venv.sh clients           # made if absent
#     bash scripts/peer_venv.sh llama-cpp --check  # only printed if made; exit 1 if not
# scripts/peers/NAME.txt lists what pip installs; NAME.no-deps.txt, where it exists, what
# is installed after it without dependencies (SGLang's frontend, as SGLang's docs install
# it beside another runtime). The venv lives under $BRAID_PEERS (~/.cache/braid/peers),
# named by a hash of the lists: clones of the same lists share one, a changed list makes a
# new one.
set -euo pipefail
cd "$(dirname "$0")/.."
name=${1:?usage: peer_venv.sh NAME [--check]}
list=scripts/peers/$name.txt
[ -f "$list" ] || { echo "peer_venv.sh: no list $list" >&2; exit 2; }
no_deps=scripts/peers/$name.no-deps.txt
hash=$(cat "$list" $( [ -f "$no_deps" ] && echo "$no_deps") | sha256sum | cut -c1-12)
venv=${BRAID_PEERS:-$HOME/.cache/braid/peers}/$name-$hash
if [ ! -f "$venv/.complete" ]; then
    [ "${2:-}" = --check ] && exit 1
    rm -rf "$venv"
    "${PYTHON:-python3}" -m venv "$venv"
    pip_install() { "$venv/bin/python" -m pip install --disable-pip-version-check -q "$@"; }
    pip_install -r "$list" >&2
    [ -f "$no_deps" ] && pip_install --no-deps -r "$no_deps" >&2
    touch "$venv/.complete"
fi
echo "$venv/bin/python"
