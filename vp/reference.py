"""The single-process reference: the uncut model trained on the same data with the same optimizer, in
one process. Every method and layout must reproduce its loss curve and final parameters. An iteration is one
global batch: the dp x microbatches microbatches that the data-parallel replicas share."""
import torch

from vp.data import loss_weights, microbatch
from vp.model import reference_model


def train_reference(cfg) -> tuple[list[float], dict[str, torch.Tensor]]:
    model = reference_model(cfg, cfg.seed)
    params = list(model.parameters())
    opt = torch.optim.AdamW(params, lr=cfg.lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.01)
    losses = []
    for it in range(cfg.iterations):
        opt.zero_grad(set_to_none=True)
        total, count = 0.0, cfg.dp * cfg.microbatches
        for mb in range(count):
            ids, targets, mask = microbatch(cfg.seed, it, mb, cfg.micro_batch_size, cfg.seq_len, cfg.vocab_size)
            loss = model.reference_loss(model(ids), targets, loss_weights(mask, count))
            loss.backward()
            total += loss.item()
        opt.step()
        losses.append(total)
    return losses, {n: p.detach().clone() for n, p in model.named_parameters()}
