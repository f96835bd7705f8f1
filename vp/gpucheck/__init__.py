"""The GPU check: one script for the first GPU machine (scripts/gpu-check.sh, docs/gpu-path.md).

Parts, in the order of what they tell per minute; each runs in its own process with its own timeout, and its
result is appended to OUT/gpu-check.json and OUT/gpu-check.md as soon as it ends, so a crash keeps what ran:

  preflight  versions, the device against the peak table (vp.flops), free memory, NCCL/CUDA variables, and every
             torch.distributed function and keyword vp/ calls, looked up in this torch
  precision  vocabulary-parallel Algorithms 1 and 2 (and the naive one) on the device's GEMMs, fp32 and bf16,
             against fp64 at the precision cases of the test suite
  race       IF's pattern on a world-size-1 NCCL group with a delayed stream: is IF's input overwritten before
             the reduce reads it (the pattern itself, and the runtime's own IF launch)
  runtime    the real runtime at world size 1 (every vocabulary algorithm and schedule family), bf16 and fp16,
             against the fp32 CPU reference loss
  passes     F B W S T IF IB at the 4b, 7b and 30b shapes, timed by CUDA events, against the h200 profile; writes
             a measured profile
  memory     rank 0 of 4b at pp 8 (its layers, vocabulary shard, AdamW) replayed through its schedule, against
             the memory model (vp.cost.memory) and the simulator's peak
  trust      numbers to trust (issue 41): no fp32 GEMM in a bf16 step (torch.profiler), no host sync inside an
             action (set_sync_debug_mode "error"), the emulation's buffer-lifetime check, the meta-device build
             of a 4b stage, and the output layer's bf16 GEMMs against the device's peak
  pipeline   with two or more GPUs only: every method at pp 2, 4, 8 over NCCL against the reference loss, and a
             rank made to fail, which must be named (skipped on a one-GPU machine)

Imports nothing from the harness (no Hydra, omegaconf, submitit or W&B): it runs with a bare python that has
torch, numpy and pyyaml. --device cpu runs every part at tiny shapes (the test suite does); race and pipeline
then skip.
"""
# each part and its timeout in seconds (cut to what is left of the budget)
PARTS = {"preflight": 40, "precision": 40, "race": 40, "trust": 60, "runtime": 105, "passes": 95, "memory": 90,
         "pipeline": 150}
NODE_PARTS = ("preflight", "trust", "pipeline")  # --gpus N: the node form, before a sweep
