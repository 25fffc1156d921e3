"""What a step runs on: a device's peak and memory bandwidth, its links, and a matmul's roofline.

:class:`Hardware` holds the figures the step-time model reads: the dense 16-bit peak (FLOP/s),
memory bandwidth (bytes/s), the link inside a node (tensor parallelism) and the one between
nodes (pipeline and data parallelism), each a :class:`Link` (alpha: seconds per message step,
beta: bytes/s one GPU sends, one direction). :data:`H100` and :data:`A100` are the datasheet
parts with their sources (achieved rates and link speeds as measured by others, not the
datasheet's); :func:`matmul_s` is the roofline of one matmul shape (Williams,
Waterman and Patterson 2009): the larger of its FLOPs at the achieved rate and its bytes at the
memory bandwidth.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from course_utils.runtime import validate

__all__ = ["Link", "Hardware", "H100", "A100", "matmul_flops", "matmul_s"]


@dataclass(frozen=True)
class Link:
    """A link in the alpha-beta model: ``alpha_s`` per message step, ``bytes_per_s`` each GPU
    sends in one direction."""

    alpha_s: float
    bytes_per_s: float

    def __post_init__(self) -> None:
        validate.check_real("alpha_s", self.alpha_s, 0, strict=False)
        validate.check_real("bytes_per_s", self.bytes_per_s)


@dataclass(frozen=True)
class Hardware:
    """One device and its links. ``efficiency``: the share of ``peak_flops`` a large matmul
    reaches (the *achieved* rate is ``peak_flops * efficiency``; 1.0 means the peak, a
    mistake on any real part)."""

    name: str
    peak_flops: float          # dense 16-bit FLOP/s (no sparsity)
    mem_bytes_per_s: float
    intra: Link                # inside a node (NVLink): the TP group's
    inter: Link                # between nodes (InfiniBand/RoCE), per GPU: PP's, CP's and DP's
    gpus_per_node: int = 8
    efficiency: float = 1.0
    source: str = ""

    def __post_init__(self) -> None:
        validate.check_real("peak_flops", self.peak_flops)
        validate.check_real("mem_bytes_per_s", self.mem_bytes_per_s)
        validate.check_int("gpus_per_node", self.gpus_per_node)
        validate.check_real("efficiency", self.efficiency, 0, maximum=1.0 + 1e-12)

    @property
    def achieved_flops(self) -> float:
        return self.peak_flops * self.efficiency

    def but(self, **changes) -> "Hardware":
        """A copy with some figures changed (``H100.but(efficiency=0.8)``)."""
        return replace(self, **changes)


# Peaks and memory bandwidth: the datasheets (NVIDIA's H100 and A100 pages; the A100's 312
# TFLOP/s is also the peak Narayanan et al. 2021 divide by). Achieved, not peak: ``efficiency``
# is the Maximum Achievable Matmul FLOPS that stas00/ml-engineering measured with torch.matmul
# at its best shape (compute/accelerator/README.md: H100 SXM 794.5 of 989, A100 SXM 271.2 of
# 312), an upper bound for any one layer. Links: NCCL's measured all-reduce bus bandwidth (the
# beta of the ring model), in a node about 370 GB/s on H100 NVLink without SHARP (NVIDIA/nccl
# issue 1442) and 235 GB/s on A100 (ml-engineering network/README.md); between nodes 46-48
# GB/s per 400 Gb/s NIC (NVIDIA/nccl-tests issue 290) and 192 GB/s for a DGX A100's eight 200
# Gb/s cards (NVIDIA/nccl issue 812), one NIC per GPU. The alphas are the course's assumption
# (3 us in a node, 10 us between: the nccl-tests small-message times of those issues, 6-38 us
# for a whole all-reduce, are of that order), small beside these jobs' messages.
H100 = Hardware("H100 SXM", 989e12, 3.35e12, Link(3e-6, 370e9), Link(10e-6, 47e9),
                efficiency=794.5 / 989,
                source="NVIDIA H100 datasheet (989 TFLOP/s dense BF16, 3.35 TB/s); MAMF 794.5 "
                       "(ml-engineering); NCCL busbw 370 GB/s NVLink, 47 GB/s per 400G NIC")
A100 = Hardware("A100 SXM", 312e12, 2.04e12, Link(3e-6, 235e9), Link(10e-6, 24e9),
                efficiency=271.2 / 312,
                source="NVIDIA A100 datasheet (312 TFLOP/s dense BF16, 2.04 TB/s); MAMF 271.2 "
                       "(ml-engineering); NCCL busbw 235 GB/s NVLink, 192 GB/s per 8 x 200G")


def matmul_flops(m: int, k: int, n: int) -> int:
    """FLOPs of an (m, k) by (k, n) matmul: a multiply and an add per term, 2mkn."""
    for name, v in (("m", m), ("k", k), ("n", n)):
        validate.check_int(name, v)
    return 2 * m * k * n


def matmul_s(m: int, k: int, n: int, hw: Hardware, elt: int = 2) -> float:
    """Seconds of an (m, k) by (k, n) matmul on ``hw``: the roofline's larger side, FLOPs at
    the achieved rate or the bytes of its three matrices (``elt`` bytes each) at the memory
    bandwidth. Big training matmuls sit on the compute side: 2mkn / (mk + kn + mn) / elt
    FLOPs per byte is in the thousands, above the H100's 989e12 / 3.35e12 = 295."""
    validate.check_int("elt", elt)
    flops = matmul_flops(m, k, n)
    moved = (m * k + k * n + m * n) * elt
    return max(flops / hw.achieved_flops, moved / hw.mem_bytes_per_s)
