"""Fit a hardware profile's free parameters to a published MFU table.

The cost model's datasheet, library and network fields stay as the base profile has them; only FITTED move, one
value each for the whole table (never per configuration). Each published run is simulated exactly as
backend=sim would (harness.sim.simulate_job); the residual of a run is log(simulated MFU / published MFU), and
the fit minimises their Huber loss (squares up to HUBER, linear beyond, so a single odd measurement does not
pull the fit) by Gauss-Newton steps on finite differences with Levenberg damping and bounds.
"""
import math
from dataclasses import dataclass, replace

import numpy as np

from harness.sim import simulate_job
from vp.config import RunConfig
from vp.cost import Hardware


@dataclass(frozen=True)
class Param:
    name: str
    low: float
    high: float
    step: float  # finite-difference step


# the overhead in two parts (docs/cost-model.md, "What a pass costs beyond its work"): kernel_s per operation a pass
# issues (so it scales with the layers in the pass and the split of B and W) and pass_overhead_s per pass
FITTED = (Param("gemm_efficiency", 0.3, 1.0, 0.01), Param("kernel_s", 0.0, 1e-4, 1e-6),
          Param("pass_overhead_s", 0.0, 5e-3, 5e-5))
HUBER = 0.05  # residuals (log ratio) beyond 5 % count linearly


def huber(r: np.ndarray) -> float:
    a = np.abs(r)
    return float(np.where(a <= HUBER, 0.5 * a**2, HUBER * (a - 0.5 * HUBER)).sum())


@dataclass
class Fit:
    hardware: Hardware
    simulated: list[float]  # MFU per published run, in the order given
    published: list[float]
    evaluations: int

    @property
    def errors(self) -> list[float]:
        """simulated / published - 1 per run."""
        return [s / p - 1 for s, p in zip(self.simulated, self.published)]

    @property
    def median_abs_error(self) -> float:
        return float(np.median(np.abs(self.errors)))


def simulate_mfu(hw: Hardware, runs: list[RunConfig]) -> list[float]:
    return [simulate_job(run, hw, "fit", {})["metrics"]["mfu"] for run in runs]


def fit_profile(base: Hardware, name: str, runs: list[RunConfig], published_mfu: list[float],
                params=FITTED, iterations: int = 12, log=lambda msg: None) -> Fit:
    base = replace(base, name=name)
    target = np.log(np.array(published_mfu))
    count = [0]

    def residuals(x):
        count[0] += 1
        hw = replace(base, **{p.name: float(v) for p, v in zip(params, x)})
        return np.log(np.array(simulate_mfu(hw, runs))) - target

    x = np.array([getattr(base, p.name) for p in params], dtype=float)
    low, high = np.array([p.low for p in params]), np.array([p.high for p in params])
    x = np.clip(x, low, high)
    r = residuals(x)
    damping = 1e-3
    for it in range(iterations):
        steps = np.array([p.step for p in params])
        step_dir = np.where(x + steps <= high, steps, -steps)
        jac = np.stack([(residuals(x + np.eye(len(x))[j] * step_dir[j]) - r) / step_dir[j]
                        for j in range(len(x))], axis=1)
        w = np.minimum(1.0, HUBER / np.maximum(np.abs(r), 1e-12))  # Huber as a reweighted square
        jtj, jtr = jac.T @ (w[:, None] * jac), jac.T @ (w * r)
        improved = False
        for _ in range(6):
            dx = -np.linalg.solve(jtj + damping * np.diag(np.diag(jtj) + 1e-12), jtr)
            x_new = np.clip(x + dx, low, high)
            r_new = residuals(x_new)
            if huber(r_new) < huber(r):
                improved, damping = True, damping / 3
                break
            damping *= 10
        log(f"  iteration {it + 1}: " + ", ".join(f"{p.name} {v:.4g}" for p, v in zip(params, x_new if improved
            else x)) + f"; median |log error| {np.median(np.abs(r_new if improved else r)):.4f}")
        if not improved:
            break
        converged = np.all(np.abs(x_new - x) < steps / 10)
        x, r = x_new, r_new
        if converged:
            break
    hw = replace(base, **{p.name: float(v) for p, v in zip(params, x)})
    simulated = [float(math.exp(v)) for v in r + target]
    return Fit(hw, simulated, list(published_mfu), count[0])
