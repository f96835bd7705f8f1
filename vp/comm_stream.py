"""Communication steps off the compute path (vp.comm's streams): a CommStream runs submitted steps in order on
a worker thread (CPU: gloo blocks its caller) or a CUDA side stream (GPU); a Handle is one step's result. On CUDA
the tensors crossing between the compute stream and the side stream are recorded on the stream that reads them
(record_stream), so that the caching allocator never reuses their memory while the other stream still uses it."""
import contextlib
import ctypes
import queue
import threading
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path

import torch

from vp import buffers
from vp.nccl import Watchdog


class Handle:
    """The result of a step submitted to a CommStream; wait() returns what the step returned. On CUDA the tensors
    it returns were made on the side stream: wait() records them on the consumer's stream, so that the side stream
    does not reuse their memory while the consumer still reads them."""

    def __init__(self, channel: str, future=None, event=None, result=None, watchdog: Watchdog | None = None,
                 checked: buffers.StepBuffers | None = None):
        self.channel, self._future, self._event, self._result = channel, future, event, result
        self._watchdog, self._checked = watchdog, checked

    def wait(self, timeout: float | None = None):
        if self._future is not None:
            self._finish(timeout)  # the result stays in the future alone while the buffer check counts references
            if self._checked is not None:
                buffers.check(self._checked, self._future)
            return self._future.result()
        consumer = torch.cuda.current_stream()
        consumer.wait_event(self._event)
        for t in _tensors(self._result):
            t.record_stream(consumer)
        return self._result

    def _finish(self, timeout: float | None):
        if self._watchdog is not None:  # as on NCCL: no timeout but the watchdog's
            self._watchdog.wait(self.channel, self._future)
            return
        try:
            self._future.result(timeout)
        except FutureTimeout:
            raise TimeoutError(f"the {self.channel} communication step gave no result within {timeout} s "
                               f"(a peer rank died or hangs)") from None


def _tensors(result) -> list[torch.Tensor]:
    """The tensors a step returned (a tensor, or a tuple or list of them; None)."""
    if isinstance(result, torch.Tensor):
        return [result]
    if isinstance(result, (tuple, list)):
        return [t for t in result if isinstance(t, torch.Tensor)]
    return []


def _cudart(maps: str | None = None):
    """The CUDA runtime library this process has loaded (torch's), by ctypes; None when none is loaded (CPU)."""
    if maps is None:
        try:
            maps = Path("/proc/self/maps").read_text()
        except OSError:
            return None
    path = next((line.split()[-1] for line in maps.splitlines() if "libcudart.so" in line), None)
    return ctypes.CDLL(path) if path else None


def side_stream(device: torch.device):
    """A communication stream of its own at the device's highest priority. Its kernels (NCCL's, and a step's small
    ones) are scheduled ahead of queued compute kernels, so a collective the compute stream will wait for is not
    stuck behind GEMMs that do not need it. Made with cudaStreamCreateWithPriority, outside torch's stream pool: the
    pool hands out 32 streams per priority round-robin, and ProcessGroupNCCL draws every communicator's stream from
    it too, so the 33rd draw would silently share a stream, and serialise two channels. Where the CUDA runtime
    cannot be reached by ctypes, a pool stream of high priority (aliasing possible past 32 draws)."""
    lib = _cudart()
    if lib is None:
        return torch.cuda.Stream(device, priority=-1)
    least, greatest = ctypes.c_int(), ctypes.c_int()
    handle = ctypes.c_void_p()
    with torch.cuda.device(device):
        if lib.cudaDeviceGetStreamPriorityRange(ctypes.byref(least), ctypes.byref(greatest)) != 0 or \
                lib.cudaStreamCreateWithPriority(ctypes.byref(handle), NON_BLOCKING, greatest) != 0:
            raise RuntimeError(f"cudaStreamCreateWithPriority failed on {device}")
    return torch.cuda.ExternalStream(handle.value, device=device)  # lives as long as the process


NON_BLOCKING = 1  # cudaStreamNonBlocking: no implicit sync with the legacy default stream (as torch's pool streams)


class CommStream:
    """Runs communication steps off the compute path, in submission order: a worker thread on CPU (gloo
    blocks the caller), a CUDA stream on GPU (NCCL and the step's small kernels run there; the caller waits
    on an event). The thread is a daemon: a rank that fails never waits for a step stuck on a dead peer."""

    def __init__(self, device: torch.device, channel: str, watchdog: Watchdog | None = None):
        self.device, self.channel, self.watchdog = device, channel, watchdog
        if device.type == "cuda":
            self.stream = side_stream(device)
        else:
            self.steps: queue.SimpleQueue = queue.SimpleQueue()
            self.thread = threading.Thread(target=self._work, name=f"comm-{channel}", daemon=True)
            self.thread.start()

    def _work(self):
        while (item := self.steps.get()) is not None:
            step, future, checked = item
            del item
            if future.set_running_or_notify_cancel():
                try:
                    with checked or contextlib.nullcontext():  # tracks the tensors the step hands to collectives
                        result = step()
                    del step  # the step's closure goes now, as a CUDA launch's does, before anyone may wait
                    future.set_result(result)
                except BaseException as err:  # noqa: BLE001 - handed to whoever waits for the step
                    future.set_exception(err)
            step = result = future = checked = None

    def submit(self, step, what: str | None = None, reads=()) -> Handle:
        """Run `step` after everything issued so far on the caller's stream. `reads`: tensors made on the caller's
        stream that the step reads. On CUDA they are recorded on the side stream: when the caller drops them, the
        allocator reuses their memory only after the side stream's work issued by then, the collective included
        (the step waits for its Work there). Without it, a tensor read only by the step (IF's partial embedding on
        a rank that is not the root, C0's buffer at its root) returns to the compute stream's pool when the launch
        drops it, and the next allocation of its size there can overwrite it before the collective reads it:
        ProcessGroupNCCL releases its own reference at work.wait(), which orders only the side stream."""
        if self.device.type == "cuda":
            self.stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(self.stream):
                result = step()
                event = torch.cuda.Event()
                event.record(self.stream)
            for t in reads:
                t.record_stream(self.stream)
            return Handle(self.channel, event=event, result=result)
        future = Future()
        checked = buffers.StepBuffers(what or self.channel, reads) if buffers.enabled() else None
        self.steps.put((step, future, checked))
        return Handle(what or self.channel, future=future, watchdog=self.watchdog, checked=checked)

    def close(self, wait: bool = True):
        if self.device.type != "cuda":
            self.steps.put(None)
            if wait:
                self.thread.join()
