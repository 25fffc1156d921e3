"""Judge of a9_activations: one function per test cell, run by the grader outside the kernel.

Each function gets ``got`` and ``ref``: ``{name: value}`` that the student's and the reference
solution's hidden tests submitted (``course_utils.checks.submit``), and raises AssertionError
with the message that names the mistake. See ``grading/judge.py``.

Q3's bytes are compared with the reference solution's measurement of the same modules; the
known wrong counts (every saved tensor counted, parameters included, elements instead of
bytes) are measured here on the same modules, rebuilt from the same seeds.
"""

import torch
from torch import nn

from course_utils import tiny_lm
from course_utils.checks import check_choice, check_number

# Course helpers that compute a graded answer outright, per answer cell: a submission whose
# answer cell (or any cell it added) uses one is flagged in the instructor's report
# (grading.integrity.helper_uses), since the question asks for the reasoning the helper does.
HELPERS_NOT_ALLOWED = {
    "q1": ["activations.korthikanti_bytes", "activations.predicted_block_bytes",
           "activations.block_terms", "activations.measured_block_bytes"],
    "q2": ["activations.korthikanti_bytes"],
    "q3": ["activations.saved_bytes", "activations.measured_block_bytes",
           "activations.measured_model_bytes"],
}

Q2_RECOMPUTES = ["none", "selective", "full"]
Q4_CHOICES = ["nothing: bf16 master weights are enough", "keep an fp32 master copy of the weights",
              "scale the loss", "keep the gradients in fp32"]

_SBH = 4096 * 2 * 5120           # Q1: s b h
_GPT_GB = _SBH * (34 + 5 * 40 * 4096 / 5120) * 40 / 1e9
_BLOCK = {"btd": 4 * 64 * 128, "btf": 4 * 64 * 512, "bt": 4 * 64, "bhtt": 4 * 8 * 64 * 64}


def q1_test(got, ref):
    check_number("q1_gpt_gb", got["q1_gpt_gb"], _GPT_GB, unit="GB", mistakes=[
        (_SBH * 34 * 40 / 1e9, "that leaves out the attention term 5 a s / h: the attention "
                               "scores, softmax and dropout grow with s^2 and are most of it."),
        (_GPT_GB / 2, "that is for one sequence: the micro-batch is b = 2."),
        (_GPT_GB / 40, "that is one layer; the model has 40."),
        (_GPT_GB * 1e9 / 2**30, "that is GiB (2^30 bytes); GB means 10^9 bytes."),
        (_GPT_GB * 1e9, "that is bytes; give GB."),
        (_GPT_GB * 2, "the formula already counts 16-bit values: do not double it."),
        (_SBH * (34 + 40 * 4096 / 5120) * 40 / 1e9,
         "the attention term is 5 a s / h: softmax output (2 bytes), dropout mask (1) and "
         "dropout output (2) per score."),
    ])
    b = _BLOCK
    elements = 8 * b["btd"] + 2 * b["btf"] + 4 * b["bt"] + b["bhtt"]
    check_number("q1_block_bytes", got["q1_block_bytes"], 4 * elements, unit="bytes", mistakes=[
        (4 * (elements - b["bhtt"]), "the attention probabilities (B, H, T, T) are missing: "
                                     "the math kernel saves them."),
        (elements, "that counts elements; each fp32 element is 4 bytes."),
        (2 * elements, "TinyLM runs in fp32: 4 bytes per element, not 2."),
        (4 * (10 * b["btd"] + 4 * b["bt"] + b["bhtt"]),
         "the MLP's two saved tensors are (B, T, F), F = 512, not (B, T, D)."),
        (4 * (8 * b["btd"] + 2 * b["btf"] + b["bhtt"]),
         "the four (B, T) LayerNorm statistics (mean and 1/std of each LayerNorm) are missing."),
        (4 * (8 * b["btd"] + 2 * b["btf"] + 4 * b["bt"] + b["bhtt"] // 8),
         "the attention matrix has one (T, T) block per head: B H T^2, H = 8."),
    ])


def q2_test(got, ref):
    check_choice("q2_recompute", got["q2_recompute"], "selective", Q2_RECOMPUTES, mistakes={
        "none": "without recomputation one sequence saves 4096 x 4096 x (34 + 160) x 32 = "
                "104.2 GB: over 40 GB even at micro-batch 1. Leaving out the attention term "
                "(34 alone: 18.3 GB per sequence) would wrongly make it fit.",
        "full": "full recomputation fits, but selective recomputation already fits (18.3 GB per "
                "sequence) with far less recomputed: the rule asks for the least recomputation.",
    })
    check_number("q2_micro_batch", got["q2_micro_batch"], 2, mistakes=[
        (4, "4 sequences with selective recomputation keep 4 x 18.3 = 73 GB: over 40 GB."),
        (1, "one sequence fits, but two fit too (36.5 GB): take the largest that fits."),
        (16, "that is the largest that fits with full recomputation (about 1.07 GB per "
             "sequence), but selective recomputation fits, and the rule puts it first."),
        (8, "8 sequences with selective recomputation keep 146 GB."),
    ])


class _ExpSquare(nn.Module):
    """exp(x)^2, as in the test cell: one storage saved three times."""

    def forward(self, x):
        y = x.exp()
        return y * y


def _q3_hidden_cases():
    """The hidden test's cases, rebuilt from the same seeds (sizes are all that matter)."""
    torch.manual_seed(1)
    block = tiny_lm.build(tiny_lm.TinyLMConfig(), 0).blocks[0]
    return [
        ("TinyLM block on (2, 16, 64)", block, (torch.randn(2, 16, 64, requires_grad=True),)),
        ("LayerNorm-Linear-Tanh on (3, 7, 16)",
         nn.Sequential(nn.LayerNorm(16), nn.Linear(16, 48), nn.Tanh()),
         (torch.randn(3, 7, 16, requires_grad=True),)),
        ("_ExpSquare on (6, 10) float64", _ExpSquare(),
         (torch.randn(6, 10, dtype=torch.float64, requires_grad=True),)),
    ]


def _variants(module, inputs):
    """Known wrong counts: every saved tensor's storage summed, parameters counted, elements."""
    params = {p.untyped_storage().data_ptr() for p in module.parameters()}
    per_tensor, with_params, elements = [0], {}, {}

    def pack(t):
        storage = t.untyped_storage()
        with_params[storage.data_ptr()] = storage.nbytes()
        if storage.data_ptr() not in params:
            per_tensor[0] += storage.nbytes()
            elements[storage.data_ptr()] = storage.nbytes() // t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        module(*inputs)
    return per_tensor[0], sum(with_params.values()), sum(elements.values())


def q3_test(got, ref):
    for name, module, inputs in _q3_hidden_cases():
        key = f"saved_activation_bytes({name})"
        kind = got[f"{key}: type"]
        if kind != "int":
            raise AssertionError(f"{key}: return a plain int (got {kind}).")
        per_tensor, with_params, elements = _variants(module, inputs)
        expected = ref[key]
        mistakes = [(v, m) for v, m in [
            (per_tensor, "each saved tensor was counted, so a storage saved several times (or "
                         "through several views) was counted several times: count each "
                         "storage once."),
            (with_params, "the module's parameters are counted too: leave them out."),
            (elements, "that counts elements; return bytes (storage.nbytes())."),
        ] if v != expected]
        check_number(key, got[key], expected, unit="bytes", rel=0.0, mistakes=mistakes)


def q4_test(got, ref):
    check_choice("q4_fix", got["q4_fix"], "keep an fp32 master copy of the weights", Q4_CHOICES,
                 mistakes={
        "nothing: bf16 master weights are enough": "bf16 keeps 8 significant bits: next to 0.02 "
            "the gap between bf16 numbers is about 1.2e-4, so a step of 1e-5 is rounded away "
            "every time. An fp32 master copy adds the steps up; the 4 bytes per parameter are "
            "what the 16-byte layout pays for it.",
        "scale the loss": "the gradients are not zero, and bf16 has fp32's exponent range: loss "
                          "scaling is for fp16, whose small gradients flush to zero.",
        "keep the gradients in fp32": "fp32 gradients (the 18-byte layout) make sums over "
            "micro-batches and ranks more accurate, but the update is still added to a bf16 "
            "weight and rounded away: the weights cannot move.",
    })
