"""The code of the synthetic students: wrong answers, cheats and attacks on the grader.

Strings of Python, put into a submission's cells by ``grading.synthetic`` (the class every
assignment is graded with: its unit mistakes, one typical mistake per assignment, the attacks an
assignment's own questions invite) and ``grading.attacks`` (the attacks on the instructor's machine,
classmates and pages). Nothing here runs in the grader.
"""

import textwrap

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
    # a11: everything split evenly, 16N / (TP x PP x DP), for both stages
    "a11_at_scale": ("q1", "from course_utils import llama_shapes\n"
                           "name, tp, pp, dp = G.q1\n"
                           "n = llama_shapes.param_count(name)\n"
                           "q1_first_gb = 16 * n / (tp * pp * dp) / 1e9\n"
                           "q1_last_gb = q1_first_gb",
                     "everything split evenly"),
    # a12: every rank's generators under one key, which DCP writes once
    "a12_checkpointing": ("q3", "import torch.distributed.checkpoint as dcp\n"
                                "from torch.distributed.checkpoint.state_dict import (\n"
                                "    get_state_dict, set_state_dict)\n"
                                "def training_state(trainer):\n"
                                "    model_sd, optim_sd = get_state_dict(trainer.model, "
                                "trainer.optimizer)\n"
                                "    return {'model': model_sd, 'optim': optim_sd,\n"
                                "            'schedule': trainer.scheduler.state_dict(),\n"
                                "            'epoch': trainer.sampler.epoch, "
                                "'position': trainer.position,\n"
                                "            'step': trainer.step, 'rng': {\n"
                                "                'torch': torch.get_rng_state(), "
                                "'numpy': np.random.get_state(),\n"
                                "                'python': random.getstate()}}\n"
                                "def save_checkpoint(trainer, path):\n"
                                "    dcp.save(training_state(trainer), checkpoint_id=path)\n"
                                "def load_checkpoint(trainer, path):\n"
                                "    state = training_state(trainer)\n"
                                "    dcp.load(state, checkpoint_id=path)\n"
                                "    set_state_dict(trainer.model, trainer.optimizer,\n"
                                "                   model_state_dict=state['model'],\n"
                                "                   optim_state_dict=state['optim'])\n"
                                "    trainer.scheduler.load_state_dict(state['schedule'])\n"
                                "    trainer.sampler.set_epoch(state['epoch'])\n"
                                "    trainer.position, trainer.step = state['position'], "
                                "state['step']\n"
                                "    torch.set_rng_state(state['rng']['torch'])\n"
                                "    np.random.set_state(state['rng']['numpy'])\n"
                                "    random.setstate(state['rng']['python'])\n"
                                "    return trainer.step",
                          "a key of its own"),
    # a13: MFU with 6N FLOPs a token, the attention scores left out
    "a13_time_at_scale": ("q3", "from course_utils.step_time import hardware, published, "
                                "transformer\n"
                                "model, device, seq, tokens_per_s = G.q3\n"
                                "n = transformer.param_count(getattr(published, model))\n"
                                "q3_mfu = tokens_per_s * 6 * n / getattr(hardware, device)"
                                ".peak_flops",
                          "6N a token"),
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
        ["uses course_utils.trainer3d.check.reference_train", "uses course_utils.data_parallel.pitfalls.one_device"])},
}


WRONG = textwrap.dedent('''
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

NOISY = textwrap.dedent('''
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

ALWAYS_EQUAL = textwrap.dedent('''
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

LYING_FLOAT = textwrap.dedent('''
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

PATCH_ISCLOSE = "import math\nmath.isclose = lambda *a, **k: True\n"
PATCH_BUILTINS = ("import builtins\nbuiltins.abs = lambda x: 0.0\n"
                   "builtins.all = lambda it: True\n")
PATCH_SYS_MODULES = textwrap.dedent('''
    import sys, types
    _syn_fake_checks = types.ModuleType("course_utils.assess.checks")
    _syn_fake_checks.check_number = lambda *a, **k: None
    _syn_fake_checks.check_choice = lambda *a, **k: None
    _syn_fake_checks.check_sequence = lambda *a, **k: None
    _syn_fake_checks.as_number = lambda name, v: 0.0
    sys.modules["course_utils.assess.checks"] = _syn_fake_checks
    import course_utils
    course_utils.assess.checks = _syn_fake_checks
    checks = _syn_fake_checks
    check_number = _syn_fake_checks.check_number
    check_choice = _syn_fake_checks.check_choice
    check_sequence = _syn_fake_checks.check_sequence
''')
FAKE_PACKAGE = {
    "course_utils/__init__.py": "",
    "course_utils/assess/checks.py": ("def check_number(*a, **k):\n    return None\n\n"
                               "check_choice = check_sequence = check_number\n"
                               "RECORD_MIME = 'x'\n"),
}

# A busy loop (holds a core until interrupted), and a polling loop that swallows the interrupt
# (waits for something that never comes, like a rank polling for a peer): the grader must stop
# both. The second one sleeps so that it does not also steal a core from the other graders.
# Attacks on the grader itself (they need the sandbox of grading.sandbox to fail). Each runs at
# the end of every answer cell of an all-wrong submission, and swallows its own errors, so the
# score it deserves is that of the wrong answers: 0.
READ_SOLUTIONS = textwrap.dedent('''
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
WRITE_LIBRARY = textwrap.dedent('''
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
WRITE_DATA = textwrap.dedent('''
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
LATE_PROCESS = textwrap.dedent('''
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
READS_EXPECTED = textwrap.dedent('''
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
REWRITES_TESTS = textwrap.dedent('''
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
HIDDEN_PAYLOAD = textwrap.dedent('''
    import base64 as _syn_b64
    get_ipython().run_cell(_syn_b64.b64decode({payload!r}).decode())
    type = lambda obj: int
    ValueError = BaseException
    isinstance = lambda *a: True
''')
HUGE_OUTPUT = "print('x' * 20_000_000)\n"
MEMORY_HOG = "_syn_hog = bytearray(8 * 2**30)\n"

LOOP = "while True:\n    pass\n"
SWALLOW = ("import time\nwhile True:\n    try:\n        while True:\n            time.sleep(0.01)\n"
            "    except KeyboardInterrupt:\n        pass\n")
