"""Judge of a11_at_scale: one function per test cell, run by the grader outside the kernel.

Each function gets ``got`` and ``ref``: ``{name: value}`` that the student's and the reference
solution's hidden tests submitted (``course_utils.assess.checks.submit``), and raises AssertionError
with the message that names the mistake. See ``grading/judge.py``.

The expected values are not the reference's: they are what PyTorch's own sharding gives, on a
fake process group (``course_utils.scale.memory.rank_state`` for the bytes a rank's sharded
tensors and AdamW's state hold, ``course_utils.scale.comms.trace_step`` for one step's
collectives), for the student's jobs (``got.givens.q1`` and ``q3``) and for Q2's hidden
cases, drawn per submission: models and meshes the notebook does not show. The typical
mistakes (padding forgotten, TP-replicated norms split, the first stage's embedding left out,
the course's even 16N / (TP x PP x DP), Megatron's 4 all-reduces per layer, the root gathered
twice) are computed here from the same givens.
"""

import functools
import math

from course_utils.assess.checks import check_number
from course_utils.models import llama_shapes
from course_utils.scale import comms as scale_comms, memory as scale_memory

HELPERS_NOT_ALLOWED = {
    "q1": ["scale.memory.rank_state", "scale.memory.state_bytes", "scale.memory.job_table",
           "scale.tables.lesson_rows", "scale.tables.job_rows"],
    "q2": ["scale.memory.rank_state", "scale.memory.state_bytes", "scale.memory.job_table"],
    "q3": ["scale.comms.trace_step", "scale.tables.comm_rows"],
}


def _draw_q2(rng):
    """rank_bytes's hidden cases: 3 (model, TP, PP, DP, stage), TP dividing the key/value
    heads, DP often not dividing the rows (padded chunks), a middle or end stage."""
    cases = []
    for model in rng.sample(["tiny", "7B", "70B", "405B"], 3):
        s = llama_shapes.shape(model)
        tp = rng.choice([t for t in (1, 2, 4, 8) if s.kv_heads % t == 0])
        pp = rng.choice([p for p in (1, 2, 3, 4, 6, 16) if p <= s.layers])
        dp = rng.choice([2, 3, 5, 6, 7, 12, 16])
        cases.append([model, tp, pp, dp, rng.randrange(pp)])
    return cases


HIDDEN_CASES = {"q2_test": _draw_q2}


@functools.lru_cache(maxsize=None)
def _simulated_bytes(model, tp, pp, dp, stage):
    return scale_memory.rank_state(model, tp, pp, dp, stage * dp * tp)["total"]


@functools.lru_cache(maxsize=None)
def _simulated_step(model, tp, pp, dp):
    return scale_comms.trace_step(model, tp, pp, dp, 0, tp_plan="per_linear")["rows"]


def _params(model, tp, pp, dp, stage, *, pad=True, embedding=True, norms_whole=True,
            even=False, split="balanced"):
    """Elements of the stage's coordinate-0 rank, with one mistake switched on by a flag."""
    s = llama_shapes.shape(model)
    if even:
        return llama_shapes.param_count(s) / (tp * pp * dp)
    n = len(llama_shapes.stage_layers(s.layers, pp, stage, split))
    h, f, v, kv = s.hidden, s.ffn, s.vocab, s.kv_heads * s.head_dim

    def chunk(rows, cols):
        return (math.ceil(rows / dp) if pad else rows / dp) * cols

    norm = chunk(h if norms_whole else h // tp, 1)
    layer = (chunk(h // tp, h) + 2 * chunk(kv // tp, h) + chunk(h, h // tp)
             + 2 * chunk(f // tp, h) + chunk(h, f // tp) + 2 * norm)
    ends = (stage == 0) * embedding * chunk(v // tp, h)
    ends += (stage == pp - 1) * (chunk(v // tp, h) + norm)
    return n * layer + ends


def _byte_mistakes(model, tp, pp, dp, stage, scale):
    """(wrong value, what it means) for the stage's bytes, in the answer's unit (``scale``)."""
    ways = [(dict(even=True), "that is 16N / (TP x PP x DP), everything split evenly: stages "
                              "differ (embedding, head, layers that do not divide by PP), "
                              "norms stay whole under TP and chunks are rounded up"),
            (dict(pad=False), "the chunks are not rounded up: FSDP2 pads each tensor's local "
                              "rows to a multiple of DP (ceil(rows / DP) per rank)"),
            (dict(norms_whole=False), "the RMSNorm weights were split over TP: tensor "
                                      "parallelism keeps them whole on every TP rank")]
    if stage == 0:
        ways.append((dict(embedding=False), "the embedding is missing: the first stage holds "
                                            "it (vocab / TP rows)"))
    if _params(model, tp, pp, dp, stage, split="even") != _params(model, tp, pp, dp, stage):
        ways.append((dict(split="even"), "that splits the layers alone evenly over the stages: "
                                         "the job counts the embedding and the output as a "
                                         "layer each, as torchtitan and Llama 3 do"))
    out = [(16 * _params(model, tp, pp, dp, stage, **kw) / scale, why) for kw, why in ways]
    if model.endswith("B"):  # (lecture 11's headline: "7B" is 6.74e9 parameters)
        out.append((16 * float(model[:-1]) * 1e9 / (tp * pp * dp) / scale,
                    "that takes the model's name for its parameter count "
                    "(llama_shapes.param_count says how many), and its stages are not equal"))
    right = 16 * _params(model, tp, pp, dp, stage)
    out += [(right / 2**30, "that is GiB (2^30 bytes); GB means 10^9 bytes"),
            (right, "that is bytes; give GB")] if scale == 1e9 else []
    return out


def q1_test(got, ref):
    model, tp, pp, dp = got.givens.q1
    first, last = (_simulated_bytes(model, tp, pp, dp, s) for s in (0, pp - 1))
    check_number("q1_first_gb", got["q1_first_gb"], first / 1e9, unit="GB", rel=1e-6,
                 mistakes=_byte_mistakes(model, tp, pp, dp, 0, 1e9))
    check_number("q1_last_gb", got["q1_last_gb"], last / 1e9, unit="GB", rel=1e-6,
                 mistakes=[(first / 1e9, "that is the first stage: the last holds the head and "
                                         "the final norm instead of the embedding"),
                           *_byte_mistakes(model, tp, pp, dp, pp - 1, 1e9)])


def q2_test(got, ref):
    for case, (model, tp, pp, dp, stage) in enumerate(got.cases, 1):
        name = f"rank_bytes on hidden case {case}"
        value = got[name]
        assert isinstance(value, int) and not isinstance(value, bool), (
            f"{name}: return an int (bytes); got {type(value).__name__}")
        check_number(name, value, _simulated_bytes(model, tp, pp, dp, stage), rel=1e-9,
                     mistakes=[(w, f"hidden case {case}: {why}") for w, why in
                               _byte_mistakes(model, tp, pp, dp, stage, 1)])


def q3_test(got, ref):
    model, tp, pp, dp = got.givens.q3
    rows = _simulated_step(model, tp, pp, dp)
    n = len(llama_shapes.stage_layers(llama_shapes.shape(model).layers, pp, 0))
    calls, tp_gb = rows[("tp", "all_reduce")]["calls"], rows[("tp", "all_reduce")]["sent"] / 1e9
    check_number("q3_tp_calls", got["q3_tp_calls"], calls, mistakes=[
        (4 * n, "4 per layer is the block plan's count (q, k, v share one input, as w1 and w3 "
                "do); the question's per_linear plan all-reduces each column-parallel linear's "
                "input gradient on its own: 2 forward + 5 backward per layer"),
        (4 * n + 1, "that is the block plan's count; the question states the per_linear plan: "
                    "5 all-reduces per layer in backward (q, k, v, w1, w3), 2 in forward"),
        (7 * n, "the embedding's forward all-reduce is missing (its rows are split over TP)"),
    ])
    check_number("q3_tp_gb", got["q3_tp_gb"], tp_gb, unit="GB", rel=1e-6, mistakes=[
        (tp_gb / 2, "a ring all-reduce sends 2(g-1)/g of the buffer, not (g-1)/g"),
        (tp_gb * 2, "the activations are bf16 (2 bytes), not fp32"),
        (tp_gb * 4 * n / calls, "that is 4 all-reduces per layer (the block plan); the "
                                "question's per_linear plan has 7"),
        (tp_gb * (4 * n + 1) / calls, "that is the block plan's traffic; the question's "
                                      "per_linear plan all-reduces 7 times per layer"),
    ])
    gather = rows[("dp", "all_gather")]["sent"] / 1e9
    s = llama_shapes.shape(model)
    root = (dp - 1) * 2 * math.ceil(s.vocab // tp / dp) * s.hidden / 1e9
    check_number("q3_dp_gather_gb", got["q3_dp_gather_gb"], gather, unit="GB", rel=1e-6,
                 mistakes=[
        (gather + root, "the embedding (the root module's own weight) is gathered once, not "
                        "twice: FSDP2 keeps the root gathered from forward to backward"),
        (gather * 2, "the weights are gathered in bf16 (2 bytes), not fp32"),
        (gather * dp / (dp - 1), "a ring all-gather sends (g-1)/g of its output, not all of it"),
    ])
