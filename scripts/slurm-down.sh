#!/usr/bin/env bash
# Stop the single-node SLURM cluster started by scripts/slurm-up.sh
# (slurmd, slurmctld, munged). Idempotent: does nothing if they are not running.
# Usage (as root): bash scripts/slurm-down.sh
set -euo pipefail

for daemon in slurmd slurmctld munged; do
  if pgrep -x "$daemon" >/dev/null 2>&1; then
    echo "[slurm-down] stopping $daemon"
    pkill -x "$daemon" || true
    for _ in $(seq 50); do pgrep -x "$daemon" >/dev/null 2>&1 || break; sleep 0.2; done
    pkill -9 -x "$daemon" 2>/dev/null || true
  fi
done
echo "[slurm-down] slurm and munge stopped"
