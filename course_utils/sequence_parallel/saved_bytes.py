"""The bytes one rank of the block saves for backward, predicted tensor by tensor.

:func:`saved_terms` lists, in elements, every tensor the block of
:mod:`course_utils.sequence_parallel.block` saves for backward, per rank, with TP alone
("tp": the LayerNorm part whole on every rank, the rest 1/t) or TP + SP ("sp": all of it 1/t);
:func:`layernorm_part` is the part TP alone replicates (Korthikanti et al.'s ``10 s b h``
term, without dropout) and :func:`predicted_saved_bytes` the total in bytes, which
:func:`course_utils.memory.activations.saved_bytes` measures equal. Serves lecture 9
(activation memory) for the package of lecture 6.
"""

from __future__ import annotations

from course_utils.runtime.validate import check_int
from course_utils.sequence_parallel.block import MODES, check_block_sizes

__all__ = ["BYTES_PER_ELEMENT", "saved_terms", "layernorm_part", "predicted_saved_bytes"]

BYTES_PER_ELEMENT = 4
"""fp32: the block runs in fp32 on the CPU."""

# (name, split by TP alone?) in the order the block saves them; the rest TP replicates
_TERMS = (("LayerNorm 1 input (block input)", False), ("LayerNorm 1 mean, 1/std", False),
          ("LayerNorm 1 output (QKV input)", False), ("Q, K, V (one buffer)", True),
          ("attention output (projection input)", True), ("log-sum-exp (B, heads, T)", True),
          ("LayerNorm 2 input (residual)", False), ("LayerNorm 2 mean, 1/std", False),
          ("LayerNorm 2 output (MLP input)", False), ("GELU input (B, T, F)", True),
          ("GELU output (down input)", True))


def saved_terms(b: int, s: int, h: int, ffn: int, n_heads: int, tp: int = 1,
                mode: str = "tp", regather: bool = True) -> dict[str, int]:
    """Elements one rank saves for backward in this module's block, by tensor (fp32, the CPU
    fused attention kernel). ``mode`` "tp": the LayerNorm part whole on every rank, the rest
    1/tp; "sp": everything 1/tp (with ``regather=False`` the two LayerNorm outputs stay whole,
    kept gathered for backward). tp = 1 is one device."""
    for name, value in (("b", b), ("s", s), ("h", h), ("ffn", ffn), ("n_heads", n_heads),
                        ("tp", tp)):
        check_int(name, value)
    if mode not in MODES:
        raise ValueError(f"mode must be one of {list(MODES)}; got {mode!r}")
    if not isinstance(regather, bool):
        raise ValueError(f"regather must be a bool; got {regather!r}")
    check_block_sizes({"b": b, "s": s, "h": h, "ffn": ffn, "n_heads": n_heads}, tp)
    btc, bt = b * s * h, b * s
    whole = dict(zip((n for n, _ in _TERMS),
                     (btc, 2 * bt, btc, 3 * btc, btc, b * n_heads * s, btc, 2 * bt, btc,
                      b * s * ffn, b * s * ffn)))
    out = {}
    for name, split_by_tp in _TERMS:
        kept_whole = (mode == "sp" and not regather and "output" in name
                      and name.startswith("LayerNorm"))
        divided = split_by_tp or mode == "sp"
        out[name] = whole[name] if kept_whole or not divided else whole[name] // tp
    return out


def layernorm_part(terms: dict[str, int]) -> int:
    """Of :func:`saved_terms`, the elements TP alone replicates: the LayerNorms' inputs (the
    residual stream), statistics and outputs."""
    if not isinstance(terms, dict) or set(terms) != {n for n, _ in _TERMS}:
        raise ValueError("terms must be a dict from saved_terms")
    return sum(terms[n] for n, split_by_tp in _TERMS if not split_by_tp)


def predicted_saved_bytes(b: int, s: int, h: int, ffn: int, n_heads: int, tp: int = 1,
                          mode: str = "tp", regather: bool = True) -> int:
    """Bytes one rank saves for backward: 4 x :func:`saved_terms`. TP: 4 (4BTC + 4BT) +
    4 (4BTC + 2BTF + BHT) / t; TP+SP (regather): 4 (8BTC + 2BTF + 4BT + BHT) / t."""
    return BYTES_PER_ELEMENT * sum(saved_terms(b, s, h, ffn, n_heads, tp, mode, regather).values())
