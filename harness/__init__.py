"""The experiment harness: Hydra sweeps, submitit dispatch (local pool or SLURM), result records, W&B,
reports. The only part of the project that knows about Hydra, submitit and W&B; vp knows nothing of it."""
