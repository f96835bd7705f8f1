"""The cost model: pass times from matrix shapes, communication over a two-level network, memory per rank.

  profiles  Hardware profiles (a100_80g, h100, h200) and their sources
  gemm      one GEMM's time from its shape (tiles, waves, alignment, roofline); elementwise work by bytes
  tensor    one device's share of a stage under tensor parallelism; the tp collectives placed and timed
  work      the work of each pass (F, B, W, S, T, IF, IB) as GEMM shapes and bytes
  passes    the seconds of each pass on a profile (cost tables: once per layer shape and stage role)
  network   NVLink inside a node, InfiniBand between nodes; ring/tree collectives and point-to-point messages
  traffic   what each communicating action sends (payloads) and each rank's bytes per channel (traffic)
  memory    parameters, optimizer state, held activations and NCCL's buffers per device
  costs     the simulator's Costs of a run, and the Costs a recorded run implies
docs/cost-model.md describes the model, its parameters and the calibration against published measurements.
"""
from vp.cost.costs import comm_times, dp_allreduce_s, pass_costs, probe_link, record_costs, tail_s
from vp.cost.memory import (Communicators, comm_buffer_bytes, layer_activation_bytes, layer_params, rank_params,
                            static_bytes)
from vp.cost.network import fit_link
from vp.cost.passes import pass_times, work_seconds
from vp.cost.profiles import GiB, PROFILES, Hardware
from vp.cost.traffic import payloads, traffic
from vp.cost.work import pass_work
from vp.schedule.actions import COMPUTE

EFF_KINDS = COMPUTE  # the pass kinds a calibrated profile gives a speed multiplier

__all__ = ["EFF_KINDS", "GiB", "PROFILES", "Communicators", "Hardware", "comm_buffer_bytes", "comm_times",
           "dp_allreduce_s",
           "fit_link", "layer_activation_bytes", "layer_params", "pass_costs", "pass_times", "pass_work", "payloads",
           "probe_link", "rank_params", "record_costs", "static_bytes", "tail_s", "traffic", "work_seconds"]
