"""Set-up: one set of pins, the README's two commands, and CI calling the test command."""

from __future__ import annotations

import os
import subprocess
import sys
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _requirements() -> list[str]:
    lines = (ROOT / "requirements.txt").read_text().splitlines()
    return [ln.strip() for ln in lines if ln.strip() and not ln.startswith("#")]


def _environment_pins() -> list[str]:
    text = (ROOT / "environment.yml").read_text()
    pip_block = text.split("- pip:", 1)[1]
    pins = re.findall(r"^\s+- (\S+==\S+)\s*$", pip_block, flags=re.M)
    return pins


def test_environment_yml_installs_the_same_pins():
    assert _environment_pins() == _requirements()
    assert "- -e ." in (ROOT / "environment.yml").read_text()


def test_every_requirement_is_pinned_exactly():
    for req in _requirements():
        assert re.fullmatch(r"[A-Za-z0-9_.-]+==[0-9][A-Za-z0-9.+-]*", req), req
    names = [r.split("==")[0].lower() for r in _requirements()]
    for needed in ("torch", "jupyterlab", "ipywidgets", "matplotlib", "nbgrader", "nbval",
                   "pytest"):
        assert needed in names
    assert "torch==2.13.0" in _requirements()


def test_installed_versions_match_the_pins():
    from importlib.metadata import version

    for req in _requirements():
        name, pinned = req.split("==")
        assert version(name).split("+")[0] == pinned, name


def test_pyproject_takes_dependencies_from_requirements():
    text = (ROOT / "pyproject.toml").read_text()
    assert 'dependencies = { file = ["requirements.txt"] }' in text


def _readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    first_block = re.search(r"```(?:bash|sh)?\n(.*?)```", text, flags=re.S).group(1)
    return [ln.split("#")[0].strip() for ln in first_block.splitlines() if ln.strip()]


def test_readme_starts_with_exactly_two_commands():
    commands = _readme_commands()
    assert commands == ["make lab", "make test"]
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^lab: setup\n\t.*scripts/workspace.py\n\t.*scripts/lab.py", makefile,
                     flags=re.M)
    assert re.search(r"^test: setup\n\t.*pytest", makefile, flags=re.M)
    assert re.search(r"^setup:\n\t@?scripts/setup.sh", makefile, flags=re.M)


def test_ci_calls_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert _readme_commands()[1] in [ln.strip() for ln in ci]


def test_parallel_groups_keep_shared_state_on_one_worker():
    """make test runs on 2 workers; these tests must not be split (see tests/conftest.py)."""
    from conftest import group_of

    assert group_of("notebooks/02_data_parallel.ipynb::Cell 3") == (
        "notebook", "notebooks/02_data_parallel.ipynb")
    a = group_of("tests/test_assignments.py::test_autograde_round_trip[a3_zero]")
    b = group_of("tests/test_grading_integrity.py::test_each_submission_gets_what_it_deserves"
                 "[a3_zero-patch_isclose]")
    assert a == b == ("grading", "grading-a3_zero")
    assert group_of("tests/test_zero.py::test_stage_bytes[2]") == ("file", "tests/test_zero.py")
    assert group_of("tests/test_memory.py::test_gb") == ("test", "tests/test_memory.py::test_gb")
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^PARALLEL := -n \$\(TEST_WORKERS\) --dist loadgroup", makefile, flags=re.M)


def test_setup_prints_a_timed_line_for_each_step_of_the_install(tmp_path):
    """scripts/setup.sh on a checkout whose .venv's pip is a stand-in printing what pip prints:
    one "setup: ... (N s)" line per package collected, one before the long silent install, one
    with the count installed, then "done"; a second run finds the stamp and prints nothing."""
    import shutil
    import subprocess

    for rel in ("scripts/setup.sh", "requirements.txt", "pyproject.toml"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / rel, tmp_path / rel)
    fake = tmp_path / ".venv" / "bin" / "python"
    fake.parent.mkdir(parents=True)
    fake.write_text("#!/bin/sh\n"
                    "[ \"$1\" = - ] && exit 1\n"  # (the CPU-index probe: no answer)
                    "case \"$*\" in *\" -e .\"*) exit 0 ;; esac\n"
                    "echo 'Collecting torch==2.13.0 (from -r requirements.txt (line 1))'\n"
                    "echo '  Downloading torch-2.13.0.whl (180 MB)'\n"
                    "echo 'Collecting nbval==0.11.0'\n"
                    "echo 'Installing collected packages: torch, nbval'\n"
                    "echo 'Successfully installed nbval-0.11.0 torch-2.13.0'\n")
    fake.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "COURSE_TORCH"))}
    out = subprocess.run(["bash", "scripts/setup.sh"], cwd=tmp_path, capture_output=True,
                         text=True, timeout=60, env=env)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert all(re.fullmatch(r"setup: .* \(\d+ s\)", ln) for ln in lines), lines
    words = [re.sub(r" \(\d+ s\)$", "", ln) for ln in lines]
    # (and, where npm is, the class hub's proxy: a real npm install into the checkout's .venv)
    proxy = ["setup: installed configurable-http-proxy 5.3.0 (the class hub's proxy) into "
             ".venv/node"] if shutil.which("npm") else []
    assert words[1:] == ["setup:   Collecting torch==2.13.0", "setup:   Collecting nbval==0.11.0",
                         "setup:   unpacking and installing them all (the longest step, 1-3 "
                         "minutes, silent)", "setup:   installed 2 packages", "setup: done",
                         *proxy], words
    assert words[0].startswith("setup: installing the pinned packages")
    again = subprocess.run(["bash", "scripts/setup.sh"], cwd=tmp_path, capture_output=True,
                           text=True, timeout=60, env=env)
    assert again.returncode == 0 and again.stdout == ""


def test_nbformat_imports_without_building_iri_parsers():
    """setup.sh removes rfc3987-syntax: ``import nbformat`` (every grading and test process)
    no longer builds its Lark parsers, and no schema the course's Jupyter packages ship asks for
    the "iri" formats it alone validated (jsonschema skips a format it has no checker for)."""
    import importlib.util

    code = "import sys, nbformat, jupyter_events.logger; print('lark' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True)
    assert out.stdout.strip() == "False"
    iri = re.compile(r"""["']?format["']?\s*:\s*["']?iri""")
    for package in ("jupyter_events", "jupyter_server", "jupyterlab_server", "nbformat",
                    "nbgrader", "jupyterlab"):
        root = Path(importlib.util.find_spec(package).origin).parent
        for path in [*root.rglob("*.json"), *root.rglob("*.yaml"), *root.rglob("*.yml")]:
            assert not iri.search(path.read_text(errors="replace")), path
