"""The CUDA-only parts of the runtime, checked as far as a CPU allows: the torch.distributed calls against the
declared floor's API, the side streams' memory (faked CUDA streams), the loss reduction on the device, the
launch environment (CUDA_DEVICE_MAX_CONNECTIONS, more local ranks than GPUs), the communicators' memory."""
import ast
import re
from pathlib import Path

import pytest
import torch

from vp import comm_stream
from vp.hostenv import CUDA_CONNECTIONS, MAX_CONNECTIONS, cuda_connections, device_index

ROOT = Path(__file__).parents[1]
FLOOR_API = Path(__file__).parent / "fixtures" / "torch-floor-distributed-api.txt"


def floor_api() -> tuple[tuple[int, int], dict[str, set[str]]]:
    """(the floor's version, name -> its parameters) from the fixture."""
    version, api = None, {}
    for line in FLOOR_API.read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        name, *params = line.split()
        if name == "floor":
            version = tuple(int(x) for x in params[0].split("."))
        else:
            api[name] = set(params)
    return version, api


def distributed_calls(path: Path) -> list[tuple[str, set[str], int]]:
    """(name under torch.distributed, keywords passed, line) of every use of torch.distributed in a file: attribute
    chains off `dist` (import torch.distributed as dist) or `torch.distributed`, and `from torch.distributed...
    import`."""
    tree = ast.parse(path.read_text())
    _mark_parents(tree)
    aliases = {"dist"}
    out = []

    def chain(node) -> list[str] | None:
        parts = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if not isinstance(node, ast.Name):
            return None
        parts.append(node.id)
        parts.reverse()
        if parts[0] in aliases:
            return parts[1:]
        if parts[:2] == ["torch", "distributed"]:
            return parts[2:]
        return None

    calls = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            calls[id(node.func)] = {k.arg for k in node.keywords if k.arg}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("torch.distributed"):
            prefix = node.module.split(".")[2:]
            out += [(".".join(prefix + [a.name]), set(), node.lineno) for a in node.names]
        elif isinstance(node, ast.Attribute) and not isinstance(getattr(node, "parent", None), ast.Attribute):
            names = chain(node)
            if names:
                out.append((".".join(names), calls.get(id(node), set()), node.lineno))
    return out


def _mark_parents(tree):
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            child.parent = node


def test_every_torch_distributed_call_exists_in_the_floor_api():
    """Every function, class or module the code takes from torch.distributed is in the floor's API, and every keyword
    it passes is a parameter there (reduce_scatter_single, which torch 2.11 lacks, fails this)."""
    version, api = floor_api()
    declared = re.search(r'"torch>=(\d+)\.(\d+)"', (ROOT / "pyproject.toml").read_text())
    assert declared and (int(declared[1]), int(declared[2])) == version, "pyproject's floor and the fixture differ"
    problems, seen = [], set()
    for path in sorted([*(ROOT / "vp").rglob("*.py"), *(ROOT / "harness").rglob("*.py")]):
        for name, keywords, line in distributed_calls(path):
            # a chain names a module or class, then maybe a member of it (ReduceOp.MAX): the longest known prefix
            known = next((".".join(name.split(".")[:n]) for n in range(name.count(".") + 1, 0, -1)
                          if ".".join(name.split(".")[:n]) in api), None)
            where = f"{path.relative_to(ROOT)}:{line}"
            if known is None:
                problems.append(f"{where}: torch.distributed.{name} is not in the floor's API ({FLOOR_API.name})")
            elif known == name and keywords - api[known]:
                missing = sorted(keywords - api[known])
                problems.append(f"{where}: torch.distributed.{name} has no parameter(s) {missing} at the floor")
            seen.add(known)
    assert not problems, "\n".join(problems)
    assert {"isend", "irecv", "reduce_scatter_tensor", "init_process_group"} <= seen  # the scan sees the calls


def test_the_api_scan_finds_a_missing_function_and_a_missing_keyword(tmp_path):
    code = tmp_path / "x.py"
    code.write_text("import torch.distributed as dist\n"
                    "dist.reduce_scatter_single(o, i, group=g, async_op=True)\n"
                    "dist.isend(t, group=g, group_dst=1, stream=s)\n")
    _, api = floor_api()
    calls = distributed_calls(code)
    assert ("reduce_scatter_single", {"group", "async_op"}, 2) in calls and "reduce_scatter_single" not in api
    (name, keywords, _), = [c for c in calls if c[0] == "isend"]
    assert keywords - api["isend"] == {"stream"}


# -- the side streams' memory --------------------------------------------------------------------------------------
class FakeStream:
    def __init__(self, name):
        self.name, self.waited = name, []

    def wait_stream(self, other):
        self.waited.append(other.name)

    def wait_event(self, event):
        self.waited.append(event)


def test_a_step_records_what_it_reads_on_its_stream_and_its_result_on_the_consumer(monkeypatch):
    """CUDA path of CommStream/Handle with faked streams: a compute-stream tensor the step reads (IF's partial
    embedding) is recorded on the side stream, so the allocator cannot hand its memory to the compute stream before
    the collective has read it; the step's result is recorded on the consumer's stream at wait()."""
    compute, recorded = FakeStream("compute"), []
    current = [compute]
    monkeypatch.setattr(torch.cuda, "Stream", lambda device, priority=0: FakeStream("side"))
    monkeypatch.setattr(torch.cuda, "current_stream", lambda *a: current[-1])

    class Use:
        def __init__(self, stream):
            self.stream = stream

        def __enter__(self):
            current.append(self.stream)

        def __exit__(self, *exc):
            current.pop()

    class Event:
        def record(self, stream):
            self.stream = stream.name

    monkeypatch.setattr(torch.cuda, "stream", Use)
    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.Tensor, "record_stream", lambda self, s: recorded.append((self.tag, s.name)))
    local, made = torch.zeros(2), torch.ones(2)
    local.tag, made.tag = "local", "result"
    ran_on = []

    def step():
        ran_on.append(current[-1].name)
        return made

    stream = comm_stream.CommStream(torch.device("cuda", 0), "IF")
    handle = stream.submit(step, "IF:0", reads=(local,))
    assert ran_on == ["side"] and stream.stream.waited == ["compute"]  # after the compute stream's work so far
    assert recorded == [("local", "side")]
    assert handle.wait() is made
    assert recorded == [("local", "side"), ("result", "compute")] and compute.waited[-1].stream == "side"


@pytest.mark.parametrize("method, rank, kind, held", [
    ("vocab-2", 1, "IF", lambda st, mb: st.embed_local[mb]),  # a rank that is not the first stage's
    ("vocab-2", 0, "C0", None),  # the buffer a rank that is not the root receives into
    ("vocab-1", 0, "C2", lambda st, mb: st.out[mb].partial_grad_x),  # T's partial grad X, summed in place
])
def test_a_launch_that_drops_a_compute_stream_tensor_hands_it_to_the_side_stream(method, rank, kind, held):
    """Executor.launch on a rank where the launch drops the last reference to a compute-stream tensor that only the
    side stream's collective then reads or writes: the launch names it in `reads` (CommStream.submit records it on
    the side stream), or the caching allocator could hand its memory to the next F or B while NCCL still uses it."""
    from types import SimpleNamespace

    from vp.config import RunConfig
    from vp.runtime.executor import Executor, RankModel
    from vp.runtime.memory import ActivationMeter
    from vp.runtime.state import IterState
    from vp.schedule import Action, build
    from vp.schedule.rules import collective
    from vp.vocab.output import OutputState

    submitted = []

    class Comm:
        def submit(self, channel, step, what=None, reads=()):
            submitted.append((channel, reads))
            return SimpleNamespace(wait=lambda timeout=None: None)

    cfg = RunConfig(method=method, pp=2, layers=2, hidden=8, heads=2, seq_len=4, vocab_size=64, microbatches=2)
    sched = build(cfg.method, cfg.pp, cfg.microbatches, 1)
    ex = Executor(cfg, sched, rank, RankModel({}), Comm(), torch.device("cpu"), ActivationMeter([]))
    ex.st, mb = IterState(0), 1
    ex.st.embed_local[mb] = torch.ones(1, cfg.seq_len, cfg.hidden)
    n = cfg.seq_len
    ex.st.out[mb] = OutputState(torch.zeros(n, cfg.hidden), torch.zeros(n, dtype=torch.long), torch.ones(n),
                                torch.zeros(n, 32), torch.zeros(3, n), partial_grad_x=torch.ones(n, cfg.hidden))
    ex.st.out_uses[mb] = 1  # C2 is its last use on this rank
    tensor = held(ex.st, mb) if held else None
    ex.launch(Action(rank, kind, mb), collective(sched, kind, mb))
    [(channel, reads)] = submitted
    assert channel == kind
    if tensor is not None:
        assert any(t is tensor for t in reads), f"{kind} drops a tensor its collective uses without naming it"
    else:
        assert [tuple(t.shape) for t in reads] == [(n, cfg.hidden + 1)]


def test_the_loss_of_a_grid_is_reduced_on_the_parameters_device():
    """total_loss all-reduces over the batch group on the device of the model (NCCL has no CPU tensors)."""
    from vp.runtime.executor import RankModel

    seen = []

    class Batch:
        def all_reduce(self, t, channel):
            seen.append((t.device.type, t.dtype, channel))
            return t.to("cpu") if t.device.type != "meta" else torch.tensor([2.5], dtype=torch.float64)

    weight = torch.nn.Parameter(torch.empty(2, device="meta"))
    model = RankModel({}, out_weight=weight, tp=Batch())
    assert model.total_loss(2.5) == 2.5
    assert seen == [("meta", torch.float64, "batch")]


# -- the launch environment ------------------------------------------------------------------------------------------
def test_cuda_connections_are_set_when_unset_and_refused_when_too_few():
    env = {}
    assert cuda_connections(env) == MAX_CONNECTIONS and env[CUDA_CONNECTIONS] == str(MAX_CONNECTIONS)
    assert cuda_connections({CUDA_CONNECTIONS: "16"}) == 16
    with pytest.raises(ValueError, match="CUDA_DEVICE_MAX_CONNECTIONS=1 serialises.*unset it"):
        cuda_connections({CUDA_CONNECTIONS: "1"})


def test_more_local_ranks_than_gpus_is_refused_with_the_fix():
    assert device_index(local_rank=1, visible=1) == 0  # per-task binding: each task sees its own GPU
    with pytest.raises(ValueError, match="4 processes on this node share 1 visible CUDA device.*at most 1 ranks"):
        device_index(local_rank=1, visible=1, local_world=4)
    assert device_index(local_rank=3, visible=8, local_world=4) == 3


def test_run_rank_refuses_a_shared_gpu_before_nccl(monkeypatch):
    """vp.run.run_rank with device=cuda on a machine with one GPU and two local ranks: the project's error, before
    any process group (NCCL would fail with 'Duplicate GPU detected')."""
    from vp.config import RunConfig
    from vp.run import run_rank

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setenv(CUDA_CONNECTIONS, "32")
    cfg = RunConfig(method="baseline", pp=2, layers=2, hidden=16, heads=2, seq_len=8, vocab_size=101, microbatches=2,
                    device="cuda", dtype="bf16")
    with pytest.raises(ValueError, match="2 processes on this node share 1 visible CUDA device"):
        run_rank(cfg, 1, 2, "file:///nonexistent", local_rank=1, local_world=2)


# -- the communicators' memory ---------------------------------------------------------------------------------------
def test_simulated_records_count_nccl_buffers_per_rank_in_peak_memory():
    """vocab-2 at pp 4 on h200: each rank holds the world's, C0 C1 IF IB and its links (the ends of the pipeline two,
    the middle four); metrics.comm_buffer_bytes is their buffers at the profile's sizes, and the peak includes it."""
    from harness.sim import simulate_job
    from vp.config import RunConfig
    from vp.cost import PROFILES

    hw = PROFILES["h200"]
    run = RunConfig(method="vocab-2", pp=4, layers=8, hidden=256, heads=4, seq_len=64, vocab_size=1000,
                    microbatches=8)
    m = simulate_job(run, hw, "t", {})["metrics"]
    links = [2, 4, 4, 2]  # fwd+ in/out and bwd- in/out
    assert m["communicators"] == [5 + n for n in links]
    assert m["comm_buffer_bytes"] == [5 * hw.comm_bytes + n * hw.link_comm_bytes for n in links]
    for detail, peak, comm in zip(m["memory_detail"], m["peak_memory_bytes"], m["comm_buffer_bytes"]):
        assert detail["comm_buffers"] == comm and peak == pytest.approx(detail["static"] + detail["activations"] + comm)
