"""The GPT cut into stages and chunks reproduces the uncut model; split backward equals whole backward."""
import pytest
import torch

from vp.config import RunConfig
from vp.data import loss_weights, microbatch
from vp.model import build_stage, reference_model, vocab_rows
from vp.wgrad import WeightGradStore

CFG = RunConfig(method="baseline", pp=2, layers=4, hidden=32, heads=4, seq_len=12, vocab_size=101, pad_multiple=8)


def batch(cfg=CFG):
    ids, targets, mask = microbatch(cfg.seed, 0, 0, 2, cfg.seq_len, cfg.vocab_size)
    return ids, targets, loss_weights(mask, 1)


def reference_grads(cfg=CFG):
    model = reference_model(cfg, cfg.seed)
    ids, targets, weights = batch(cfg)
    loss = model.reference_loss(model(ids), targets, weights)
    loss.backward()
    return loss.detach(), {n: p.grad for n, p in model.named_parameters()}


@pytest.mark.parametrize("split", [[1, 3], [2, 2], [0, 4], [1, 1, 1, 1], [2, 0, 1, 1]])
@pytest.mark.parametrize("split_w", [False, True])
@pytest.mark.parametrize("loss_fn", ["reference_loss", "loss"])
def test_staged_model_matches_uncut(split, split_w, loss_fn):
    ref_loss, ref_grads = reference_grads()
    stages = [build_stage(CFG, CFG.seed, s, split, local_vocab=True) for s in range(len(split))]
    ids, targets, weights = batch()
    inputs, outputs, stores, x = [], [], [], ids
    for st in stages:
        store = WeightGradStore() if split_w else None
        x_in = x if st.first else x.detach().requires_grad_()
        out = st(x_in, store)
        inputs.append(x_in)
        stores.append(store)
        outputs.append(out)
        x = out
    loss = getattr(stages[-1], loss_fn)(outputs[-1], targets, weights, stores[-1])
    loss.backward()  # the last stage, then hand each input gradient to the stage before
    for i in range(len(stages) - 2, -1, -1):
        outputs[i].backward(inputs[i + 1].grad)
    if split_w:
        assert all(len(s) > 0 for s, n in zip(stores, split) if n)
        for s in stores:
            s.flush()
    torch.testing.assert_close(loss.detach(), ref_loss)
    grads = {n: p.grad for st in stages for n, p in st.named_parameters()}
    assert set(grads) == set(ref_grads)
    for name, g in grads.items():
        torch.testing.assert_close(g, ref_grads[name], rtol=1e-5, atol=1e-7, msg=name)


def test_fused_loss_accumulates_like_the_reference_loss():
    """Two microbatches into the same gradients (the second accumulates in place), padded vocabulary."""
    grads = {}
    for loss_fn in ("reference_loss", "loss"):
        stage = build_stage(CFG, CFG.seed, 1, [1, 3], local_vocab=True)
        losses = []
        for index in range(2):
            ids, targets, mask = microbatch(CFG.seed, 0, index, 2, CFG.seq_len, CFG.vocab_size)
            x = torch.randn(2, CFG.seq_len, CFG.hidden, generator=torch.Generator().manual_seed(index))
            losses.append(getattr(stage, loss_fn)(stage(x), targets, loss_weights(mask, 2)))
            losses[-1].backward()
        grads[loss_fn] = (torch.stack(losses).detach(), {n: p.grad for n, p in stage.named_parameters()})
    torch.testing.assert_close(grads["loss"][0], grads["reference_loss"][0], rtol=1e-6, atol=0)
    for name, g in grads["reference_loss"][1].items():
        torch.testing.assert_close(grads["loss"][1][name], g, rtol=1e-5, atol=1e-7, msg=name)
    assert torch.count_nonzero(grads["loss"][1]["head"][CFG.vocab_size:]) == 0, "padding got gradient"


def test_vocab_rows_are_the_same_alone_or_whole():
    whole = vocab_rows(3, "head.weight", 2500, 0, 2560, 8)
    part = vocab_rows(3, "head.weight", 2500, 1000, 2560, 8)
    assert torch.equal(whole[1000:], part)
    assert torch.count_nonzero(whole[2500:]) == 0 and torch.count_nonzero(whole[:2500]) > 0


def test_model_is_deterministic_from_its_seed():
    a, b = reference_model(CFG, 1), reference_model(CFG, 1)
    c = reference_model(CFG, 2)
    for (n, p), (_, q), (_, r) in zip(a.named_parameters(), b.named_parameters(), c.named_parameters()):
        assert torch.equal(p, q)
        if p.dim() == 2:
            assert not torch.equal(p, r), n
