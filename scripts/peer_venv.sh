#!/usr/bin/env bash
# Makes the venv of one peer (a library braid is checked against, never one braid depends
# on) and prints its python:
#     bash scripts/peer_venv.sh clients           # made if absent
#     bash scripts/peer_venv.sh llama-cpp --check  # only printed if made; exit 1 if not
# scripts/peers/NAME.txt lists what pip installs; NAME.first.txt, where it exists, what is
# installed before it (torch, pinned so that pip never resolves a CUDA build); NAME.no-deps.txt,
# where it exists, what is installed after it without dependencies (SGLang's frontend, as
# SGLang's docs install it beside another runtime). The venv lives under $BRAID_PEERS
# (~/.cache/braid/peers), named by a hash of the lists: clones of the same lists share one, a
# changed list makes a new one. Callers may run at once: one builds under a lock on
# VENV.lock while the others wait for it, and a venv is used only once `.complete` is in it.
set -euo pipefail
cd "$(dirname "$0")/.."
name=${1:?usage: peer_venv.sh NAME [--check]}
list=scripts/peers/$name.txt
[ -f "$list" ] || { echo "peer_venv.sh: no list $list" >&2; exit 2; }
first=scripts/peers/$name.first.txt
no_deps=scripts/peers/$name.no-deps.txt
lists=()
for f in "$first" "$list" "$no_deps"; do
    if [ -f "$f" ]; then lists+=("$f"); fi
done
hash=$(cat "${lists[@]}" | sha256sum | cut -c1-12)
peers=${BRAID_PEERS:-$HOME/.cache/braid/peers}
venv=$peers/$name-$hash
if [ ! -f "$venv/.complete" ]; then
    [ "${2:-}" = --check ] && exit 1
    mkdir -p "$peers"
    exec 9>"$venv.lock"
    flock 9
    if [ ! -f "$venv/.complete" ]; then  # else another caller built it while this one waited
        rm -rf "$venv"
        "${PYTHON:-python3}" -m venv "$venv"
        pip_install() { "$venv/bin/python" -m pip install --disable-pip-version-check -q "$@"; }
        if [ -f "$first" ]; then pip_install -r "$first" >&2; fi
        pip_install -r "$list" >&2
        if [ -f "$no_deps" ]; then pip_install --no-deps -r "$no_deps" >&2; fi
        touch "$venv/.complete"
    fi
    exec 9>&-
fi
echo "$venv/bin/python"
