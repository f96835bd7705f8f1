"""Executes one rank's actions of a schedule: the flat dispatch loop (loop.py) over per-kind actions
(executor.py), with per-iteration state (state.py) and CPU memory accounting (memory.py)."""
