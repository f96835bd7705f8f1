"""FLOP counts of the paper (arXiv 2411.05288, section 3), forward + backward, for `tokens` = b * s tokens.

Transformer layer: b s h (72 h + 12 s) with ffn = 4h; in general 3 * (8 b s h^2 + 4 b s^2 h + 4 b s h ffn).
Output layer: 6 b s h V. Input layer: 3 b s h. The backward is twice the forward (input plus weight gradient).
"""


def layer_flops(tokens: int, seq_len: int, hidden: int, ffn_hidden: int) -> float:
    # qkv + out projection: 8 t h^2; attention scores and values: 4 t s h; MLP: 4 t h ffn; times 3 for fwd+bwd
    return 3.0 * (8 * tokens * hidden**2 + 4 * tokens * seq_len * hidden + 4 * tokens * hidden * ffn_hidden)


def output_flops(tokens: int, hidden: int, vocab: int) -> float:
    return 6.0 * tokens * hidden * vocab


def input_flops(tokens: int, hidden: int) -> float:
    return 3.0 * tokens * hidden


def model_flops(sequences: int, seq_len: int, hidden: int, ffn_hidden: int, layers: int, vocab: int) -> float:
    """Model FLOPs of one iteration over `sequences` sequences (docs/design.md, Metrics); vocab is the unpadded size."""
    tokens = sequences * seq_len
    return output_flops(tokens, hidden, vocab) + layers * layer_flops(tokens, seq_len, hidden, ffn_hidden)


# dense bf16/fp16 peak FLOP/s of a device, by the name CUDA reports (first match wins, so the specific names
# come first): the datasheets' dense tensor-core figures (the H100 PCIe card is the slower part)
DEVICE_PEAKS = {"A100": 312e12, "H100 PCIe": 756e12, "H100": 989e12, "H200": 989e12}
