#!/usr/bin/env bash
# Stop the SLURM cluster started by scripts/slurm-up.sh: its slurmds and slurmctld by the PID files its slurm.conf
# names, and munged only when slurm-up.sh started it (scripts/slurm-pids.sh). Never by process name, so another
# SLURM or munge on the machine is left alone. Idempotent: does nothing if they are not running.
# Usage (as root): bash scripts/slurm-down.sh [--dry-run]   (--dry-run: say what would be stopped, stop nothing)
set -euo pipefail
# shellcheck source=scripts/slurm-pids.sh
. "$(dirname "$0")/slurm-pids.sh"
DRY=0; [ "${1:-}" = "--dry-run" ] && DRY=1

if ! ours_conf; then
  echo "[slurm-down] $CONF was not written by scripts/slurm-up.sh: nothing of this project's to stop"
  exit 0
fi
stop() {  # stop NAME PID
  echo "[slurm-down] $([ "$DRY" = 1 ] && echo "would stop" || echo stopping) $1 (pid $2)"
  [ "$DRY" = 1 ] || stop_pid "$2" "$1"
}
for n in $(node_names); do
  pid=$(alive "/run/slurmd-$n.pid" slurmd); [ -n "$pid" ] && stop slurmd "$pid"
done
pid=$(alive /run/slurmctld.pid slurmctld); [ -n "$pid" ] && stop slurmctld "$pid"
if [ -e "$STARTED_MUNGE" ]; then
  pid=$(alive /run/munge/munged.pid munged)
  if [ -n "$pid" ]; then stop munged "$pid"; fi
  [ "$DRY" = 1 ] || rm -f "$STARTED_MUNGE"
fi
echo "[slurm-down] $([ "$DRY" = 1 ] && echo "dry run: nothing stopped" || echo "this project's slurm daemons stopped")"
