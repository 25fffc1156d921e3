"""Module 8 (JAX): every equality the lecture states, and the collectives read from the HLO.

The collective names are asserted exactly, so a JAX/XLA upgrade that changes what the compiler
inserts (or how the HLO names it) fails here, loudly, before the lecture's text goes stale.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from course_utils import framework_compare as fc
from course_utils import jax_sharding as js
from course_utils import memory

SEEDS = (0, 1)


def test_the_helper_refuses_when_jax_started_with_fewer_devices():
    code = ("import os; os.environ.pop('XLA_FLAGS', None); import jax; jax.devices()\n"
            "from course_utils import jax_sharding as js\n"
            "try:\n    js.require_devices(8)\nexcept RuntimeError as e:\n    print('ERR', e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60).stdout
    assert "ERR JAX has 1 CPU device(s), and 8 are needed" in out
    assert "XLA_FLAGS" in out and "--xla_force_host_platform_device_count=8" in out


def test_the_rest_of_course_utils_imports_without_jax():
    code = ("import pkgutil, sys, importlib, course_utils\n"
            "for m in pkgutil.iter_modules(course_utils.__path__):\n"
            "    if m.name not in ('jax_sharding',):\n"
            "        importlib.import_module('course_utils.' + m.name)\n"
            "print('jax' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.stdout.strip().splitlines()[-1] == "False", out.stderr[-2000:]


def test_this_process_has_eight_devices():
    assert len(js.require_devices(8)) == 8


def test_with_device_flag_replaces_the_count():
    assert js.with_device_flag("--a=1 --xla_force_host_platform_device_count=2", 8) == (
        "--a=1 --xla_force_host_platform_device_count=8")
    with pytest.raises(ValueError, match="n must be an int >= 1"):
        js.with_device_flag("", 0)


def test_bad_input_names_the_argument():
    with pytest.raises(ValueError, match="shape must be"):
        js.make_mesh((0,), ("data",))
    with pytest.raises(ValueError, match="names must give one distinct"):
        js.make_mesh((2, 4), ("data", "data"))
    mesh = js.make_mesh((8,), ("model",))
    with pytest.raises(ValueError, match="names axis 'data'; the mesh's axes are"):
        js.place(np.ones((8, 8)), mesh, js.P("data"))
    with pytest.raises(TypeError, match="spec must be a PartitionSpec"):
        js.place(np.ones((8, 8)), mesh, ("model",))
    with pytest.raises(ValueError, match="layout must be one of"):
        js.jit_linear("diagonal", mesh)
    with pytest.raises(ValueError, match="not divisible"):
        js.local_bytes((6, 4), js.P("model"), {"model": 4})
    with pytest.raises(TypeError, match="hlo must be"):
        js.collectives(None)


def test_shard_table_and_bytes_come_from_the_local_shards():
    mesh = js.make_mesh((2, 4), ("data", "model"))
    w = js.place(np.ones((16, 32), np.float32), mesh, js.P(None, "model"))
    rows = js.shard_table(w)
    assert [r["device"] for r in rows] == list(range(8))
    # devices 1 and 5 differ only in "data": the same block, replicated
    assert rows[1]["block"] == "[:, 8:16]" and rows[5]["block"] == "[:, 8:16]"
    assert {r["shape"] for r in rows} == {(16, 8)}
    assert js.bytes_per_device(w) == {d: 16 * 8 * 4 for d in range(8)}
    assert js.local_bytes((16, 32), js.P(None, "model"), {"data": 2, "model": 4}) == 16 * 8 * 4
    assert js.global_bytes(w) == 16 * 32 * 4


def test_collectives_parser_reads_each_format():
    hlo = "\n".join([
        "  %all-reduce = f32[4,16]{1,0} all-reduce(%x), channel_id=1, "
        "replica_groups={{0,1,2,3},{4,5,6,7}}, use_global_device_ids=true, to_apply=%add",
        "  %ag = f32[32,64]{1,0} all-gather(%p), channel_id=2, replica_groups=mesh['axis_0'=8,"
        "'axis_1'=1] {'axis_0'}, dimensions={0}",
        "  %rs = (f32[16,8]{1,0}, bf16[2]{0}) reduce-scatter(%a, %b), replica_groups=[1,8]<=[8]",
        "  %add = f32[4] add(%a, %b)"])
    got = js.collectives(hlo)
    assert [c.op for c in got] == ["all-reduce", "all-gather", "reduce-scatter"]
    assert [c.nbytes for c in got] == [256, 8192, 16 * 8 * 4 + 4]
    assert [c.group_size for c in got] == [4, 8, 8]


def test_collectives_parser_reads_async_pairs_once_with_the_result_bytes():
    """XLA on GPU prints async collectives as -start/-done pairs; the -start's type is the tuple
    (operand, result[, context]). Each pair counts once, with the result's shape and bytes."""
    hlo = "\n".join([
        "  %all-gather-start = (f32[4,16]{1,0}, f32[32,16]{1,0}) all-gather-start(f32[4,16]{1,0} "
        "%p), channel_id=1, replica_groups=[1,8]<=[8], dimensions={0}, use_global_device_ids=true",
        "  %dot = f32[8,8]{1,0} dot(%a, %b), lhs_contracting_dims={1}, rhs_contracting_dims={0}",
        "  %all-gather-done = f32[32,16]{1,0} all-gather-done((f32[4,16]{1,0}, f32[32,16]{1,0}) "
        "%all-gather-start)",
        "  %collective-permute-start = (f32[2,4]{1,0}, f32[2,4]{1,0}, u32[], u32[]) "
        "collective-permute-start(f32[2,4]{1,0} %x), channel_id=2, source_target_pairs={{0,1},{1,0}}",
        "  %collective-permute-done = f32[2,4]{1,0} collective-permute-done(%collective-permute-start)",
        "  %all-reduce-start = bf16[1024]{0} all-reduce-start(bf16[1024]{0} %g), channel_id=3, "
        "replica_groups={{0,1}}, to_apply=%add",
        "  %all-reduce-done = bf16[1024]{0} all-reduce-done(bf16[1024]{0} %all-reduce-start)"])
    got = js.collectives(hlo)
    assert [c.op for c in got] == ["all-gather", "collective-permute", "all-reduce"]
    assert [c.shapes for c in got] == [((32, 16),), ((2, 4),), ((1024,),)]
    assert [c.nbytes for c in got] == [32 * 16 * 4, 2 * 4 * 4, 1024 * 2]
    assert [c.group_size for c in got] == [8, None, 2]  # (the -start names the groups)


def test_lesson_two_replicas_in_jax():
    out = js.lesson_two_replicas()
    assert out["local_grads"] == [[2.0, 4.0], [6.0, 0.0]]
    assert out["mean_grad"] == [4.0, 2.0]
    np.testing.assert_allclose(out["new_w"], [0.6, 0.8], rtol=1e-6)
    assert [(c.op, c.group_size) for c in out["collectives"]] == [("all-reduce", 2)]


@pytest.mark.parametrize("seed", SEEDS)
def test_data_parallel_gradient_equals_one_device(seed):
    out = js.dp_step_check(seed=seed)
    for got, one, shards in zip(out["grads"], out["one_device"], out["mean_of_shards"]):
        np.testing.assert_allclose(got, one, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(got, shards, rtol=1e-5, atol=1e-6)
    assert all(spec == js.P() for spec in out["grad_sharding"])   # replicated, like the params
    assert [(c.op, c.group_size) for c in out["collectives"]] == [("all-reduce", 8)]


EXPECTED_JIT = {"column": [], "column, gathered": ["all-gather"], "row": ["all-reduce"],
                # XLA's CPU compiler all-reduces, then each device keeps its slice
                "row, scattered": ["all-reduce"], "fsdp": ["all-gather"]}
EXPECTED_SHARD_MAP = {"column": [], "column, gathered": ["all-gather"], "row": ["all-reduce"],
                      "row, scattered": ["reduce-scatter"], "fsdp": ["all-gather"]}


@pytest.fixture(scope="module")
def layouts():
    return {seed: js.compare_layouts(seed=seed) for seed in SEEDS}


@pytest.mark.parametrize("seed", SEEDS)
def test_jit_and_shard_map_equal_one_device_and_pytorch(layouts, seed):
    x, w = js.linear_inputs(seed)
    torch_y = torch.nn.functional.linear(torch.from_numpy(x), torch.from_numpy(w.T.copy()))
    for row in layouts[seed]:
        np.testing.assert_allclose(row["y_jit"], row["y_one_device"], rtol=1e-5, atol=1e-5,
                                   err_msg=row["layout"])
        np.testing.assert_allclose(row["y_shard_map"], row["y_jit"], rtol=1e-5, atol=1e-5,
                                   err_msg=row["layout"])
        torch.testing.assert_close(torch.from_numpy(row["y_jit"].copy()), torch_y, rtol=1e-5,
                                   atol=1e-5)
        assert row["y_spec"] == row["y"]


def test_hlo_collectives_of_each_layout(layouts):
    rows = layouts[0]
    assert {r["layout"]: [c.op for c in r["jit"]] for r in rows} == EXPECTED_JIT
    assert {r["layout"]: [c.op for c in r["shard_map"]] for r in rows} == EXPECTED_SHARD_MAP
    assert {r["layout"]: js.LAYOUTS[r["layout"]].explicit for r in rows} == {
        k: (v[0] if v else None) for k, v in EXPECTED_SHARD_MAP.items()}
    by = {r["layout"]: r for r in rows}
    # tokens=16, h_in=32, h_out=64 fp32 on 8 devices: what each collective's result holds
    assert by["row"]["jit"][0].nbytes == 16 * 64 * 4                  # the full (tokens, h_out)
    assert by["row, scattered"]["shard_map"][0].nbytes == 16 * 8 * 4   # one device's slice
    assert by["fsdp"]["jit"][0].nbytes == 32 * 64 * 4                  # the whole W, gathered
    assert all(c.group_size == 8 for r in rows for c in r["jit"] + r["shard_map"])
    for r in rows:
        assert r["w_bytes_per_device"] == {d: 32 * 64 * 4 // 8 for d in range(8)}


def _torch_row_parallel(x_local, w_local, bias, tp_group=None):
    import torch.distributed as dist

    partial = x_local @ w_local
    dist.all_reduce(partial, group=tp_group)
    return partial + bias


def test_jax_row_parallel_equals_module_4s_pytorch_row_parallel_on_gloo_ranks():
    """The same layer, same numbers: JAX's row layout on 8 devices (jit and shard_map) and
    module 4's row-parallel linear on 2 gloo ranks."""
    from course_utils import tensor_parallel as tp

    for seed in SEEDS:
        x, w = js.linear_inputs(seed)
        mesh = js.make_mesh((8,), ("model",))
        xs, ws = js.place(x, mesh, js.P(None, "model")), js.place(w, mesh, js.P("model", None))
        y_jit = np.array(js.jit_linear("row", mesh)(xs, ws))           # (tokens, h_out), a copy
        y_map = np.array(js.shard_map_linear("row", mesh)(xs, ws))
        runs = tp.run_row_parallel(_torch_row_parallel, 2, [torch.from_numpy(x)[None]],
                                   torch.from_numpy(w), torch.zeros(w.shape[1]), timeout_s=60)
        for run in runs:
            y_torch = run["y"][0]                                  # (tokens, h_out)
            torch.testing.assert_close(torch.from_numpy(y_jit), y_torch, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(torch.from_numpy(y_map), y_torch, rtol=1e-5, atol=1e-5)


def test_fsdp_bytes_match_the_zero3_formula():
    out = js.fsdp_state()
    zero3 = memory.zero_state_bytes(out["n_params"], 8, 3, "fp32_adam")["total"]
    assert set(out["bytes_per_device"].values()) == {zero3}
    assert out["global_bytes"] == 16 * out["n_params"] == 8 * zero3
    assert [c.op for c in out["forward"]] == ["all-gather"] * 4   # each weight and bias
    assert [c.op for c in out["linear_step"]] == ["all-gather", "all-reduce"]
    # four distinct states, each a quarter of the bytes (before, grads and both moments were one
    # list of buffers counted three times)
    assert set(out["parts_per_device"].values()) == {zero3 // 4}


def test_bytes_per_device_counts_a_shared_buffer_once():
    mesh = js.make_mesh((8,), ("data",))
    a = js.place(np.zeros((64, 4), np.float32), mesh, js.P("data"))
    b = js.place(np.zeros((64, 4), np.float32), mesh, js.P("data"))
    per_device = 64 * 4 * 4 // 8
    assert set(js.bytes_per_device({"x": a, "y": a}).values()) == {per_device}
    assert set(js.bytes_per_device({"x": a, "y": b}).values()) == {2 * per_device}


@pytest.mark.parametrize("seed", SEEDS)
def test_2d_mesh_mlp(seed):
    out = js.mlp_2d(seed=seed)
    predicted = sum(js.local_bytes(out["shapes"][k], out["specs"][k], out["mesh_shape"])
                    for k in ("w1", "w2"))
    assert predicted == 2 * 16 * 64 * 4 // 4
    assert set(out["bytes_per_device"].values()) == {predicted}
    assert set(out["x_bytes_per_device"].values()) == {8 * 16 * 4 // 2}
    assert [(c.op, c.group_size, c.shapes) for c in out["forward"]] == [
        ("all-reduce", 4, ((4, 16),))]
    assert [(c.op, c.group_size) for c in out["step"]] == [("all-reduce", 4), ("all-reduce", 2)]
    assert out["step"][1].shapes == ((16, 16), (16, 16))  # each device's W1, W2 gradient blocks
    for got, want in zip(out["new"], out["one_device"]):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def _row_parallel(x_local, w_local, b):
    import jax
    return jax.lax.psum(x_local @ w_local, "model") + b


def test_row_parallel_harness_runs_a_function_on_eight_devices():
    rng = np.random.default_rng(3)
    x, w, b = rng.standard_normal((4, 16)), rng.standard_normal((16, 5)), rng.standard_normal(5)
    out = js.row_parallel_harness(_row_parallel, x, w, b)
    np.testing.assert_allclose(out["y"], x @ w + b, rtol=1e-5, atol=1e-5)
    assert out["collectives"] == ["all-reduce"]
    with pytest.raises(TypeError, match="fn must be a function"):
        js.row_parallel_harness(None, x, w, b)


def test_pinned_workload_losses_agree_between_frameworks():
    w = fc.Workload(steps=6, warmup=2, workers=4, global_batch=64)
    result = fc.compare(w)
    assert result["loss_rel_diff"] <= fc.LOSS_RTOL
    np.testing.assert_allclose(result["torch"]["losses"], result["jax"]["losses"],
                               rtol=fc.LOSS_RTOL)
    assert result["jax"]["collectives"] == ["all-reduce"]
    assert result["jax"]["workers"] == "4 CPU devices, 1 process"
    assert result["torch"]["threads"] == 1
    assert result["jax"]["compile_s"] > 0 and result["torch"]["compile_s"] is None
    text = fc.table(result)
    assert "torch " in text and "jax 0.10.2" in text and "cores" in text
    # each step records its loss before its update: the last one is the loss at step 6 (after
    # 5 updates), not "after 6"
    assert "loss at step 6" in text and f"{result['jax']['losses'][-1]:.7f}" in text


def test_workload_rejects_bad_settings():
    with pytest.raises(ValueError, match="global_batch = 100 must be divisible by workers = 8"):
        fc.Workload(global_batch=100)
    with pytest.raises(ValueError, match="warmup must be"):
        fc.Workload(steps=3, warmup=3)
    with pytest.raises(ValueError, match="dtype must be 'float32'"):
        fc.Workload(dtype="bfloat16")


def test_the_device_count_is_fixed_when_the_cpu_backend_starts_not_at_import():
    """Lecture 8's setup: XLA_FLAGS set after `import jax` but before the first jax.devices()
    still gives 8 devices; so does jax.config.update("jax_num_cpu_devices", 8); after the
    backend has started, the flag is ignored and the config update raises."""
    def run(code: str) -> str:
        env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             timeout=120, env=env)
        assert out.returncode == 0, out.stderr[-2000:]
        return out.stdout.strip()

    flag = "os.environ['XLA_FLAGS'] = '--xla_force_host_platform_device_count=8'"
    assert run(f"import os, jax\n{flag}\nprint(len(jax.devices()))") == "8"
    assert run("import jax\njax.config.update('jax_num_cpu_devices', 8)\n"
               "print(len(jax.devices()))") == "8"
    late = run(f"import os, jax\njax.devices()\n{flag}\nprint(len(jax.devices()))\n"
               "try:\n    jax.config.update('jax_num_cpu_devices', 8)\n"
               "except RuntimeError as e:\n    print('refused:', e)")
    assert late.splitlines()[0] == "1" and "before backends are initialized" in late
