"""Tensor parallelism inside one pipeline stage: 1-D (Megatron column/row, optionally sequence parallel), 2-D (SUMMA
on [q, q, 1]) and 2.5-D (SUMMA on [q, q, d], arXiv 2105.14500), one concept per file. See docs/tensor-parallel.md."""
