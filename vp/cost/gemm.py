"""Time of one GEMM from its shape, and of elementwise work from its bytes.

A GEMM C[m, n] (+)= A[m, k] B[k, n] (batch of them) runs as output tiles of tile_m x tile_n spread over the SMs
in waves (NVIDIA, Matrix Multiplication Background User's Guide, "Dimension Quantization Effects"):
- tile quantization: a partial tile costs a whole one;
- wave quantization: a partial last wave costs a whole one (tiles = ceil(m/tm) ceil(n/tn) batch, waves =
  ceil(tiles / sms)); the best of the tiles tile_m x tile_n, tile_n x tile_m and tile_n x tile_n is taken, as
  the library's heuristics choose among its kernels;
- a fixed cost per tile (pipeline fill, epilogue) of tile_k_overhead k-steps: efficiency k / (k + overhead);
- alignment: Tensor Core kernels load 16-byte vectors; a dimension that is a multiple of only 8, 4 or 2 bytes
  (or odd, in 2-byte elements) takes a narrower-load kernel, modelled as
  1 / (1 + align_penalty (16 / alignment_bytes - 1));
- a roofline: never faster than the bytes it moves (A, B, and C, twice when accumulated) over the memory
  bandwidth. Efficiency therefore grows with the size of every dimension and saturates at gemm_efficiency.
Elementwise work (LayerNorm, GeLU, dropout-add, softmax, embedding lookups) takes bytes / (bandwidth x
mem_efficiency).
A measured profile answers with its GEMM table where it covers the shape (vp.cost.tables: interpolated between
measured shapes); this model, with the parameters fitted to the same table, answers elsewhere.
"""
import math
from dataclasses import dataclass

from vp.cost.profiles import Hardware


@dataclass(frozen=True)
class Gemm:
    m: int  # rows of C
    n: int  # columns of C
    k: int  # the reduced dimension
    batch: int = 1
    in_bytes: int = 2  # element size of A and B
    out_bytes: int = 2  # element size of C
    accumulate: bool = False  # C is read as well as written (weight gradients summed into fp32)

    def __post_init__(self):  # a stage's Work repeats its layers' few shapes hundreds of times: hashed once each
        object.__setattr__(self, "_hash", hash((self.m, self.n, self.k, self.batch, self.in_bytes, self.out_bytes,
                                                self.accumulate)))

    def __hash__(self) -> int:
        return self._hash

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.n * self.k * self.batch

    @property
    def traffic(self) -> float:
        c = self.m * self.n * self.out_bytes * (2 if self.accumulate else 1)
        return float(self.batch * ((self.m * self.k + self.k * self.n) * self.in_bytes + c))


def alignment_bytes(dims: tuple[int, ...], elem_bytes: int) -> int:
    """The largest power of two (up to 16) bytes that every dimension's row length is a multiple of."""
    out = 16
    for d in dims:
        size = d * elem_bytes
        out = min(out, size & -size)  # lowest set bit
    return out


def alignment(hw: Hardware, g: Gemm) -> float:
    return 1.0 / (1.0 + hw.align_penalty * (16 / alignment_bytes((g.m, g.n, g.k), g.in_bytes) - 1))


def quantization(hw: Hardware, g: Gemm) -> float:
    """Useful fraction of the tile-waves a GEMM occupies (1.0 without SMs to quantize over)."""
    if hw.sms <= 0:
        return 1.0
    best = 0.0
    for tm, tn in ((hw.tile_m, hw.tile_n), (hw.tile_n, hw.tile_m), (hw.tile_n, hw.tile_n)):
        tiles = math.ceil(g.m / tm) * math.ceil(g.n / tn) * g.batch
        waves = math.ceil(tiles / hw.sms)
        best = max(best, g.m * g.n * g.batch / (waves * hw.sms * tm * tn))
    return best


def efficiency(hw: Hardware, g: Gemm) -> float:
    """Fraction of peak this GEMM reaches before the roofline: every shape effect times gemm_efficiency."""
    fill = g.k / (g.k + hw.tile_k_overhead)
    return hw.gemm_efficiency * quantization(hw, g) * fill * alignment(hw, g)


def gemm_time(hw: Hardware, g: Gemm, speedup: float = 1.0) -> float:
    """Seconds of one GEMM; `speedup` is a calibrated per-pass-kind multiplier on its compute rate. Computed once
    per shape and profile (hw.gemm_memo: the profile is frozen, the shape too)."""
    key = (g, speedup)
    got = hw.gemm_memo.get(key)
    if got is None:
        got = hw.gemm_memo[key] = _gemm_time(hw, g, speedup)
    return got


def _gemm_time(hw: Hardware, g: Gemm, speedup: float) -> float:
    measured = hw.tables.gemm_s(g.m, g.n, g.k, g.accumulate)
    if measured is not None:
        return measured * g.batch / speedup
    compute = g.flops / (hw.peak_flops * efficiency(hw, g) * speedup)
    return max(compute, g.traffic / hw.mem_bandwidth)


def elementwise_time(hw: Hardware, nbytes: float, tensor_bytes: float = 0.0, fresh_bytes: float = 0.0) -> float:
    """Seconds of elementwise steps moving `nbytes` over tensors of `tensor_bytes` each, `fresh_bytes` of them
    written into newly allocated tensors: at the rate the profile measured in place for tensors of that size, plus
    its measured cost of a fresh output's bytes at that size (vp.cost.tables; on a CPU, page faults where the
    allocator does not reuse memory); else at the analytical bandwidth, allocation free."""
    if not tensor_bytes or not len(hw.tables.elementwise):
        return nbytes / (hw.mem_bandwidth * hw.mem_efficiency)
    rate, fresh_s = hw.tables.elementwise_rate(tensor_bytes)
    return nbytes / rate + fresh_bytes * fresh_s
