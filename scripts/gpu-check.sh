#!/usr/bin/env bash
# The GPU check (docs/gpu-path.md): scripts/gpu-check.sh [--device cuda|cpu] [--out DIR] [--budget-s 480] [--parts ...]
# [--gpus N]: the node form (N >= 2 GPUs of one node), to run before a sweep
# Runs with the system python3 as it is: torch, numpy and pyyaml, no venv, no install, no network; nothing of
# Hydra, omegaconf, submitit or W&B is imported. PYTHON=... picks another interpreter (make gpu-check: the venv's).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"  # vp/ is found from here; --out is relative to the caller
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
exec "${PYTHON:-python3}" -m vp.gpucheck "$@"
