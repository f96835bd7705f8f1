"""The vocabulary algorithms as rows (VOCAB): where the vocabulary layers live and how the output layer's passes
synchronise. Data at the bottom of vp.schedule: the schedule's actions read them, methods (methods.py) pair one
with a schedule family.
"""
from dataclasses import dataclass


@dataclass(frozen=True)
class VocabAlgorithm:
    """Where the vocabulary layers live and how the output layer's passes synchronise (arXiv 2411.05288)."""
    name: str
    parallel: bool  # split over all ranks as S/T/IF/IB passes (else: input layer on the first stage, output on the last)
    synchronous: bool = False  # the naive output layer: its barriers sit inside S and T, entered by all ranks at once
    after_s: tuple[str, ...] = ()  # collectives launched right after S on every rank
    after_t: tuple[str, ...] = ()  # collectives launched right after T
    grad_x_from: str | None = None  # what hands grad X to the last stage's B: a collective of after_s/after_t, or "T"
    extra_warmup: int = 0  # extra warm-up forwards (1F1B, interleaved), so S/C1/T fit before the last stage's B
    s_gemms: int = 0  # of the output layer's three GEMMs (logits, grad X, grad W): how many S computes ...
    t_gemms: int = 0  # ... and how many T computes
    vhalf_gap: int = 0  # V-Half slots by which the backward slots are delayed, room for S and T between the last
    # stage's F and B (official stable_pattern_v_half: 6 for one barrier, 12 for two)
    barriers: int = 0  # communication barriers per microbatch (points where compute waits for a collective)

    @property
    def collectives(self) -> tuple[str, ...]:
        """The pipeline collectives (besides C0, IF, IB) each rank enters once per microbatch."""
        return self.after_s + self.after_t

    @property
    def grad_x_in_s(self) -> bool:
        """S precomputes the input gradient's local part (Algorithm 2: A_i = P_i W_i and E_i)."""
        return self.grad_x_from in self.after_s


VOCAB = {
    v.name: v
    for v in [
        VocabAlgorithm("local", parallel=False),
        VocabAlgorithm("naive", parallel=True, synchronous=True, grad_x_from="T", s_gemms=1, t_gemms=2, barriers=3),
        VocabAlgorithm("alg1", parallel=True, after_s=("C1",), after_t=("C2",), grad_x_from="C2", extra_warmup=2,
                       s_gemms=1, t_gemms=2, vhalf_gap=12, barriers=2),
        VocabAlgorithm("alg2", parallel=True, after_s=("C1",), grad_x_from="C1", extra_warmup=1, s_gemms=2,
                       t_gemms=1, vhalf_gap=6, barriers=1),
    ]
}


def get_vocab(name: str) -> VocabAlgorithm:
    if name not in VOCAB:
        raise ValueError(f"vocabulary algorithm {name!r} is unknown; one of {', '.join(VOCAB)}")
    return VOCAB[name]
