"""What a rank's Comm counts (vp.comm): calls, payload bytes and barriers per (channel, op), so that tests can pin
"Algorithm 2 has one barrier" and runs can report bytes sent per group."""
import contextlib
from collections import Counter

import torch

from vp.buffers import touch


class TrafficCounts:
    """The counters of vp.comm.Comm, keyed (channel, op), and their sums by op or by channel."""

    def __init__(self):
        self.calls, self.bytes_sent, self.barriers = Counter(), Counter(), Counter()  # keyed (channel, op)

    def _count(self, channel: str, op: str, t: torch.Tensor, sends: bool = True):
        touch(t)  # inside a communication step under VP_CHECK_BUFFERS=1: a tensor whose lifetime is checked
        self.calls[(channel, op)] += 1
        if sends:
            self.bytes_sent[(channel, op)] += t.numel() * t.element_size()

    def by_op(self, counter: Counter) -> dict[str, float]:
        out = Counter()
        for (_, op), n in counter.items():
            out[op] += n
        return dict(sorted(out.items()))

    def by_channel(self, counter: Counter) -> dict[str, float]:
        out = Counter()
        for (channel, _), n in counter.items():
            out[channel] += n
        return dict(sorted(out.items()))

    def reset_counts(self):
        self.calls.clear()
        self.bytes_sent.clear()
        self.barriers.clear()

    @contextlib.contextmanager
    def barrier(self, name: str):
        """Marks one communication barrier: a point where compute waits for a collective's result."""
        self.barriers[name] += 1
        yield
