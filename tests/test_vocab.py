"""Vocabulary-parallel output and input layers against their single-process references (gloo, CPU)."""
import pytest
import torch
import torch.nn.functional as F

from vp.comm import Comm
from vp.schedule.methods import VOCAB
from vp.config import padded_vocab_size
from vp.vocab.input import accumulate_grad, local_lookup
from vp.vocab.output import (Shard, c1_step, c2_step, check_inputs, naive_backward, naive_forward, s_pass,
                             t_pass)

BARRIERS = {"naive": 3, "alg1": 2, "alg2": 1}


def problem(seed: int, n: int, h: int, vocab: int):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, h, generator=g)
    w = torch.randn(vocab, h, generator=g) * 0.5
    targets = torch.randint(0, vocab, (n,), generator=g)
    mask = (torch.rand(n, generator=g) > 0.3).float()
    return x, w, targets, mask / mask.sum()


def reference(x, w, targets, weights):
    x, w = x.clone().requires_grad_(), w.clone().requires_grad_()
    loss = (weights * F.cross_entropy(x @ w.t(), targets, reduction="none")).sum()
    loss.backward()
    return loss.detach(), x.grad, w.grad


def run_output(rank, world, algorithm, seed, n, h, vocab, pad_multiple, microbatches=1):
    """One rank's S / C1 / T / C2 (or naive) passes; returns loss, grad x, its grad W shard, the counts."""
    x, w, targets, weights = problem(seed, n, h, vocab)
    padded = padded_vocab_size(vocab, pad_multiple, world)
    shard = Shard.of(rank, world, padded, vocab)
    full = torch.zeros(padded, h)
    full[:vocab] = w
    weight = full[shard.start:shard.start + shard.rows].clone().requires_grad_()
    comm = Comm.local(list(range(world)), rank, torch.device("cpu"))
    for _ in range(microbatches):
        if algorithm == "naive":
            state = naive_backward(shard, weight, naive_forward(shard, weight, x, targets, weights, comm), comm)
        else:
            algo = VOCAB[algorithm]
            state = c1_step(s_pass(shard, weight, x, targets, weights, algo), comm, algo)
            state = t_pass(shard, weight, state, algo)
            if algorithm == "alg1":
                state = c2_step(state, comm)
    out = (state.loss, state.grad_x, weight.grad, dict(comm.barriers), sum(comm.calls.values()))
    comm.close()
    return out


def check_against_reference(results, seed, n, h, vocab, microbatches=1):
    ref_loss, ref_gx, ref_gw = reference(*problem(seed, n, h, vocab))
    loss, grad_x, _, _, _ = results[0]
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(grad_x, ref_gx, rtol=1e-5, atol=1e-6)
    grad_w = torch.cat([r[2] for r in results])
    torch.testing.assert_close(grad_w[:vocab], ref_gw * microbatches, rtol=1e-5, atol=1e-6)
    assert torch.count_nonzero(grad_w[vocab:]) == 0, "padded rows received gradient"
    for r in results[1:]:
        torch.testing.assert_close(r[0], loss)


@pytest.mark.parametrize("algorithm", ["naive", "alg1", "alg2"])
@pytest.mark.parametrize("world", [1, 2, 4])
def test_output_layer_matches_cross_entropy(pools, algorithm, world):
    args = (algorithm, 7, 24, 16, 37, None)  # 37 tokens: padded to 38 (p=2) and 40 (p=4)
    results = [run_output(0, 1, *args)] if world == 1 else pools(world).run(run_output, *args)
    check_against_reference(results, 7, 24, 16, 37)


@pytest.mark.parametrize("algorithm", ["naive", "alg1", "alg2"])
def test_barriers_per_microbatch(pools, algorithm):
    results = pools(4).run(run_output, algorithm, 3, 8, 8, 50, None, 3)
    barriers = results[0][3]
    assert sum(barriers.values()) == 3 * BARRIERS[algorithm], barriers
    check_against_reference(results, 3, 8, 8, 50, microbatches=3)


@pytest.mark.parametrize("algorithm", ["alg1", "alg2", "naive"])
def test_padding_multiple_and_a_shard_of_only_padding(pools, algorithm):
    """37 tokens padded to 64 over 4 shards of 16 rows: shard 3 holds only padding."""
    results = pools(4).run(run_output, algorithm, 11, 12, 8, 37, 64)
    assert results[3][2].abs().sum() == 0
    check_against_reference(results, 11, 12, 8, 37)


def test_padded_and_unpadded_agree():
    exact = run_output(0, 1, "alg2", 5, 16, 8, 37, 1)
    padded = run_output(0, 1, "alg2", 5, 16, 8, 37, 64)
    torch.testing.assert_close(padded[0], exact[0], rtol=1e-6, atol=0)
    torch.testing.assert_close(padded[1], exact[1], rtol=1e-6, atol=1e-9)
    torch.testing.assert_close(padded[2][:37], exact[2], rtol=1e-6, atol=1e-9)
    assert torch.count_nonzero(padded[2][37:]) == 0


def run_input(rank, world, seed, vocab):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (3, 5), generator=g)
    w = torch.randn(vocab, 6, generator=g)
    grad = torch.randn(3, 5, 6, generator=g)
    padded = padded_vocab_size(vocab, None, world)
    shard = Shard.of(rank, world, padded, vocab)
    full = torch.zeros(padded, 6)
    full[:vocab] = w
    weight = full[shard.start:shard.start + shard.rows].clone().requires_grad_()
    comm = Comm.local(list(range(world)), rank, torch.device("cpu"))
    emb = comm.reduce(local_lookup(shard, weight, ids), 0, "IF")  # IF
    got = comm.broadcast(grad.clone() if rank == 0 else torch.empty_like(grad), 0, "IB")  # IB
    accumulate_grad(shard, weight, ids, got)
    comm.close()
    return emb, weight.grad


@pytest.mark.parametrize("world", [2, 4])
def test_input_layer_matches_embedding(pools, world):
    results = pools(world).run(run_input, 9, 23)
    g = torch.Generator().manual_seed(9)
    ids = torch.randint(0, 23, (3, 5), generator=g)
    emb = torch.nn.Embedding(23, 6)
    with torch.no_grad():
        emb.weight.copy_(torch.randn(23, 6, generator=g))
    grad = torch.randn(3, 5, 6, generator=g)
    out = emb(ids)
    out.backward(grad)
    torch.testing.assert_close(results[0][0], out.detach())
    grad_w = torch.cat([r[1] for r in results])
    torch.testing.assert_close(grad_w[:23], emb.weight.grad)
    assert torch.count_nonzero(grad_w[23:]) == 0


def test_bad_input_names_the_field():
    shard = Shard.of(0, 2, 10, 9)
    weight = torch.zeros(5, 4)
    with pytest.raises(ValueError, match="x has shape .*expected \\[tokens, 4\\]"):
        check_inputs(shard, weight, torch.zeros(3, 5), torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match="targets have shape"):
        check_inputs(shard, weight, torch.zeros(3, 4), torch.zeros(2, dtype=torch.long))
    with pytest.raises(ValueError, match="token id 9 is outside the vocabulary \\[0, 9\\)"):
        check_inputs(shard, weight, torch.zeros(2, 4), torch.tensor([1, 9]))
    with pytest.raises(ValueError, match="weight has 4 rows but shard 0 of 2 has 5"):
        check_inputs(shard, torch.zeros(4, 4), None, torch.tensor([1]))
    with pytest.raises(ValueError, match="vocab_size=3 is smaller than the 4 vocabulary shards"):
        padded_vocab_size(3, None, 4)
    with pytest.raises(ValueError, match="pad_multiple=6 is not divisible by the 4 vocabulary shards; .* 4 or 8"):
        padded_vocab_size(100, 6, 4)
