"""Grading on the instructor's own machine (issue 23): nothing of the host reaches a kernel,
nothing a kernel leaves reaches the grader, no submission stops the others.

Slow tests share one autograde (:func:`host_run`) of one assignment (a1: no torch, the cheapest
kernels) with a fake instructor's home beside the course data (a private key, last year's
checkout with its solutions, the collect inbox with a classmate's work, a tool), a secret in the
grader's environment, an honest student ("correct", the classmate whose results the attacks
target) and every attack of ``grading.attacks.host_cases_for``. Each must get the score its
answers deserve; no file outside the students' own results may change, no secret may appear in
anything the grader wrote, and feedback holds HTML only. Fast tests: ``collect`` against an
inbox of links, named pipes, sparse files and odd names; the sandbox's own command line.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import nbformat
import pytest

from conftest import REFERENCE_CACHE, ROOT, _snapshot
from grading import attacks, integrity, sandbox, synthetic, workflow
from grading.files import NotRegular, read_regular, write_private

A = "a1_training_state"
MEMORY_GB = 2  # the kernels' memory in this run: the /tmp flood then writes 3 GiB, not 7


@dataclass
class HostRun:
    cases: dict
    results: dict
    data: Path
    host: attacks.Host
    host_before: dict
    host_after: dict
    changed: list


@pytest.fixture(scope="module")
def host_run(tmp_path_factory) -> HostRun:
    data = tmp_path_factory.mktemp("grading-host") / "data"
    data.mkdir()
    host = attacks.Host.make(tmp_path_factory.mktemp("instructor-home"), A)
    reference = integrity.reference_run(A, data, cache=REFERENCE_CACHE)
    honest = [(c, f) for c, f in synthetic.cases_for(A, reference) if c.kind == "correct"]
    # (the CPU hog and the slow honest student first: one in each worker, at the same time)
    cases = synthetic.write(attacks.host_cases_for(A, host, data, MEMORY_GB) + honest,
                            data / "submitted", A)
    workflow.register(A, data, release_dir=data / "release")
    before, host_before = _snapshot(), host.state()
    old = os.environ.get("COURSE_FAKE_TOKEN")
    os.environ["COURSE_FAKE_TOKEN"] = host.token  # a secret in the grader's environment
    try:
        slowest = max(r["max_cell_s"] for r in reference.values())
        workflow.autograde(A, workers=2, data=data, students=[c.student for c in cases],
                           timeout=int(max(15, 4 * slowest + 5)), register_first=False,
                           reference_cache=REFERENCE_CACHE,
                           extra_args=[f"--SandboxedKernelManager.memory_gb={MEMORY_GB}"])
        workflow.feedback(A, data=data)
    finally:
        if old is None:
            os.environ.pop("COURSE_FAKE_TOKEN")
        else:
            os.environ["COURSE_FAKE_TOKEN"] = old
    after = _snapshot()
    changed = sorted(str(p) for p in before if before[p] != after.get(p))
    results, _ = integrity.report(A, data)  # (refuses if any digest changed)
    keep = ROOT / "test-artifacts" / "grading-reports"
    keep.mkdir(parents=True, exist_ok=True)
    shutil.copy(data / "reports" / f"{A}.txt", keep / f"{A}-host.txt")
    return HostRun({c.kind: c for c in cases}, {r.student: r for r in results}, data, host,
                   host_before, host.state(), changed)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["correct", *attacks.HOST_ATTACKS])
def test_each_attack_gets_what_its_answers_deserve(host_run, kind):
    case, result = host_run.cases[kind], host_run.results[kind]
    detail = integrity.render_text(A, [result])
    assert result.status == "graded", detail
    assert result.score == pytest.approx(case.deserved), detail
    for words in case.flags:
        assert any(words in f for f in result.flags), f"no flag with {words!r}:\n{detail}"
    for words in case.limits:
        assert any(words in line for line in result.limits), f"no LIMIT {words!r}:\n{detail}"
    if kind == "correct":
        assert not result.flags and not result.limits, detail


@pytest.mark.slow
def test_student_content_is_inert_in_every_autograded_notebook(host_run):
    """What the formgrader and the feedback render (the autograded notebooks): outputs are
    plain text or base64 PNG/JPEG with no metadata, and every markdown cell that is not the
    release's own shows its HTML as text (issue 41)."""
    from grading import inert

    release = nbformat.read(ROOT / "assignments" / A / f"{A}.ipynb", as_version=4)
    course = {c.source for c in release.cells if c.cell_type == "markdown"}
    checked = 0
    for path in (host_run.data / "autograded").glob(f"*/{A}/{A}.ipynb"):
        nb = nbformat.read(path, as_version=4)
        for cell in nb.cells:
            for out in cell.get("outputs", []):
                data = out.get("data", {})
                assert set(data) <= {"text/plain", "image/png", "image/jpeg"}, (path, data)
                assert all(inert.is_base64(v) for m, v in data.items() if m != "text/plain")
                assert not out.get("metadata"), (path, out)
                checked += 1
            if cell.cell_type == "markdown" and cell.source not in course:
                assert "<" not in cell.source.replace("&lt;", ""), (path, cell.source)
    assert checked > 0
    scripted = nbformat.read(host_run.data / "autograded" / "script_outputs" / A / f"{A}.ipynb",
                             as_version=4)
    attack = [c for c in scripted.cells if attacks.SCRIPT_MARKER in c.source
              and c.cell_type == "code"][-1]
    notes = [o["data"]["text/plain"] for o in attack.get("outputs", [])
             if "the grader removed" in o.get("data", {}).get("text/plain", "")]
    assert len(notes) == 6, notes  # html, javascript, svg, markdown, latex, the forged png
    answers = [c.source for c in scripted.cells if c.cell_type == "markdown"
               and attacks.SCRIPT_MARKER in c.source]
    assert answers and all("shows the HTML of this cell as text" in a for a in answers)


@pytest.mark.slow
def test_no_report_line_is_forged_or_hidden(host_run):
    """The exception named with a newline and terminal escapes, and the metadata key that is a
    line, are one escaped line each in the text report (issue 41)."""
    text = (host_run.data / "reports" / f"{A}.txt").read_text()
    assert "\x1b" not in text and "\r" not in text
    lines = text.split("\n")
    assert not any(line.lstrip().startswith(("r3_ghost", "r4_ghost", "r5_ghost", "q1 passed"))
                   for line in lines)
    block = text[text.index("forged_report:"):].split("\n\n")[0]
    assert "Error\\nr3_ghost: 10 / 10\\x1b[2K\\r" in block, block
    assert "x\\nr5_ghost" in block, block


@pytest.mark.slow
def test_what_every_kernel_left_is_gone(host_run):
    """No kernel folder, tmpfs or cgroup of a grading process that has ended: the attacks
    that filled, deepened and locked their socket folders left nothing behind (issue 41)."""
    from grading import cgroups

    left = [str(p) for root in (Path("/dev/shm"), *cgroups.CGROUP_ROOTS) if root.is_dir()
            for p in root.glob(f"{cgroups.CGROUP_PREFIX}*") if cgroups.creator_alive(p.name)
            is False]
    assert left == []
    mounts = Path("/proc/self/mounts").read_text()
    assert not [line for line in mounts.splitlines() if f"/{cgroups.CGROUP_PREFIX}" in line
                and cgroups.creator_alive(line.split()[1].split("/")[-2]) is False]


@pytest.mark.slow
def test_the_host_is_untouched_and_unread(host_run):
    """The fake home is as it was (modes included: nothing chmod-ed), no file of the course
    changed, and no secret (the key, the classmate's work, the tool's output, the grader's
    environment) is in anything grading wrote: autograded notebooks, judge logs, feedback,
    reports, logs."""
    assert host_run.host_after == host_run.host_before
    assert host_run.changed == [], host_run.changed
    assert not list((ROOT / "test-artifacts").glob(f"pwned-{attacks.SCRIPT_MARKER}*"))
    secrets = (host_run.host.marker, host_run.host.token)
    leaked = []
    for path in host_run.data.rglob("*"):
        if path.is_file() and not path.is_symlink() and "submitted" not in path.parts:
            text = path.read_bytes()
            leaked += [f"{path}: {s}" for s in secrets if s.encode() in text]
    assert leaked == []


@pytest.mark.slow
def test_feedback_holds_html_only_and_results_are_plain_files(host_run):
    for folder in (host_run.data / "feedback").glob(f"*/{A}"):
        assert sorted(p.name for p in folder.iterdir()) == [f"{A}.html"], folder
    for folder in (host_run.data / "autograded").glob(f"*/{A}"):
        entries = list(folder.iterdir())
        assert [p.name for p in entries] == [f"{A}.ipynb"], folder
        assert all(p.is_file() and not p.is_symlink() for p in entries)
    html = (host_run.data / "feedback" / "huge_prints" / A / f"{A}.html")
    assert html.stat().st_size < 3_000_000


@pytest.mark.slow
def test_the_gradebook_survives(host_run):
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{host_run.data / 'gradebook.db'}") as gb:
        assert {s.id for s in gb.students} >= set(host_run.cases)


ACTIVE_CONTENT = """(root) => {
    const found = [];
    for (const el of document.querySelector(root).querySelectorAll("*")) {
        for (const a of el.attributes) {
            if (/^on/i.test(a.name)) found.push(`${el.tagName} ${a.name}`);
            if (/^\\s*(javascript|vbscript):/i.test(a.value)) found.push(`${el.tagName} ${a.name}`);
        }
        if (["IFRAME", "OBJECT", "EMBED", "FORM", "BASE"].includes(el.tagName)) found.push(el.tagName);
        if (el.tagName === "SCRIPT" && el.textContent.includes("__course_pwned")) found.push("SCRIPT");
        if (el.tagName === "META" && /refresh/i.test(el.getAttribute("http-equiv") || "")) found.push("META");
    }
    return {ran: window.__course_pwned || 0, found: found};
}"""


@pytest.mark.slow
@pytest.mark.browser
def test_no_student_script_runs_in_the_formgrader_or_the_feedback(host_run):
    """Issue 41: the submission whose outputs and written answer are pages of script, opened
    as the instructor does (the formgrader's submission view, in the instructor's authenticated
    Jupyter session) and as the student does (the feedback page): nothing runs (the payloads
    count themselves in ``window.__course_pwned`` and try to write a file through the Jupyter
    API), no event handler, ``javascript:`` link, frame or form is left in the page, and the
    student's words are still there to grade. Then the raw submission, as handed in, opened in
    JupyterLab itself: an untrusted notebook, whose HTML JupyterLab sanitizes and whose
    JavaScript it does not run."""
    from jupyterlab_harness import LabServer, chromium, open_notebook
    from nbgrader.api import Gradebook

    student = "script_outputs"
    with Gradebook(f"sqlite:///{host_run.data / 'gradebook.db'}") as gb:
        sid = gb.find_submission_notebook(A, A, student).id
    pwned = ROOT / "test-artifacts" / f"pwned-{attacks.SCRIPT_MARKER}.txt"
    feedback = host_run.data / "feedback" / student / A / f"{A}.html"
    with chromium() as browser:
        page = browser.new_page()
        page.goto(feedback.as_uri())
        page.wait_for_timeout(1500)
        seen = page.evaluate(ACTIVE_CONTENT, "body")
        assert seen == {"ran": 0, "found": []}, seen
        assert attacks.SCRIPT_MARKER in page.inner_text("body")
        with LabServer(root_dir=ROOT, extra_env={"COURSE_DATA": str(host_run.data)}) as server:
            page.goto(server.url(f"formgrader/submissions/{sid}/"))
            page.wait_for_selector("#notebook-container", timeout=60_000)
            page.wait_for_timeout(2000)
            seen = page.evaluate(ACTIVE_CONTENT, "#notebook-container")
            text = page.inner_text("#notebook-container")
        assert seen == {"ran": 0, "found": []}, seen
        assert attacks.SCRIPT_MARKER in text and "My explanation." in text
        with LabServer() as lab:
            raw = host_run.data / "submitted" / student / A / f"{A}.ipynb"
            path = lab.add_file(raw, f"{A}.ipynb")
            open_notebook(page, lab, path)
            page.wait_for_timeout(2000)
            assert page.evaluate("() => window.__course_pwned || 0") == 0
    assert not pwned.exists()


ALLOWED_TOP = {"usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc", "dev", "proc",
               "tmp", "home", "submission", "run"}


def _bound_paths() -> list[Path]:
    """The host folders bound into the sandbox at their own paths (besides HOST_PATHS)."""
    return [*sandbox._environment_roots(), sandbox.ROOT / "course_utils"]


def _chains(bound: list[Path]) -> dict[str, list[str]]:
    """What each folder on the way from / to a bound folder must hold: the next step, nothing
    beside it (bwrap makes those folders to bind the path; nothing else of the host is there).
    Not checked: a host folder bound whole (/usr), and the kernel's own /tmp; /home holds the
    kernel's own home too."""
    whole = [h for h in sandbox.HOST_PATHS if os.path.isdir(h) and not os.path.islink(h)]
    out: dict[str, set[str]] = {}
    for path in bound:
        parts = path.parts
        for i in range(2, len(parts)):
            folder = str(Path(*parts[:i]))
            if folder == "/tmp" or any(folder == h or folder.startswith(h + "/") for h in whole):
                continue
            out.setdefault(folder, set()).add(parts[i])
    if "/home" in out:
        out["/home"].add("student")
    return {k: sorted(v) for k, v in out.items()}


CHAIN_PROBE = """
import json, os
print(json.dumps({p: sorted(os.listdir(p)) for p in %r if os.path.isdir(p)}))
"""


@pytest.mark.slow
def test_the_kernel_sees_only_its_allowlist(tmp_path):
    """A sandboxed kernel's whole world: the root holds only the allowlisted folders and the
    way to the bound ones, /etc only the grader's three files and the loader's, the
    environment only ENVIRONMENT's names; the course data, this repository (but course_utils),
    the host's home and /tmp are not there; nothing outside its tmpfs can be written; each
    folder on the way to a bound one holds that way and nothing beside it (wherever the
    checkout lives: /var/tmp, /srv, /home)."""
    import json

    from grading.preprocessors import RecoveringExecute

    if not sandbox.enabled() or sandbox.bwrap_path() is None:
        pytest.skip("no bubblewrap on this machine")
    chains = _chains(_bound_paths())
    probe = f"""
import json, os
def writable(p):
    try:
        open(os.path.join(p, "probe"), "w").close()
        return True
    except OSError:
        return False
print(json.dumps({{
    "root": sorted(os.listdir("/")), "etc": sorted(os.listdir("/etc")),
    "env": sorted(os.environ), "repo": sorted(os.listdir({str(ROOT)!r})),
    "chains": {{p: sorted(os.listdir(p)) for p in {sorted(chains)!r} if os.path.isdir(p)}},
    "seen": [p for p in {[str(tmp_path), str(Path.home() / ".ssh"),
                          str(ROOT / "solutions"), str(ROOT / "grading"), str(ROOT / "authoring"),
                          str(integrity.data_dir())]!r} if os.path.exists(p)],
    "writable": [p for p in ["/", "/usr", "/etc", {str(ROOT / 'course_utils')!r}, "/tmp",
                             "/home/student", "/submission"] if writable(p)],
    "cwd": os.getcwd(), "tmp": os.listdir("/tmp")}}))
"""
    (tmp_path / "marker").write_text("the grader's own folder")
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    nb.cells = [nbformat.v4.new_code_cell(probe)]
    RecoveringExecute(timeout=60, startup_timeout=120).preprocess(
        nb, {"metadata": {"path": str(tmp_path)}})
    seen = json.loads(nb.cells[0].outputs[0]["text"])
    allowed_top = ALLOWED_TOP | {Path(p).parts[1] for p in _bound_paths()}
    assert set(seen["root"]) <= allowed_top, set(seen["root"]) - allowed_top
    assert seen["chains"] == chains
    assert set(seen["etc"]) <= {"hosts", "passwd", "group", "ld.so.cache", "fonts"}, seen["etc"]
    assert set(seen["env"]) <= set(sandbox.ENVIRONMENT) | {"PWD", "LC_CTYPE", "SHLVL", "_",
                                                           "MPLBACKEND", "PYDEVD_USE_FRAME_EVAL",
                                                           "CLICOLOR", "CLICOLOR_FORCE", "FORCE_COLOR",
                                                           "TERM", "GIT_PAGER", "PAGER"}, seen["env"]
    assert "course_utils" in seen["repo"] and set(seen["repo"]) <= {"course_utils", ".venv"}
    assert seen["seen"] == []
    assert seen["writable"] == ["/tmp", "/home/student", "/submission"]
    assert seen["cwd"] == sandbox.WORKDIR


@pytest.mark.parametrize("place", ["/var/tmp", "/srv"])
def test_a_checkout_anywhere_shows_only_the_way_to_its_library(place, monkeypatch):
    """A checkout under /var/tmp or /srv (a fresh clone's usual homes): inside the sandbox,
    each folder on the way to its course_utils holds that way and nothing else (the fresh
    clone's `make test` once failed here: /var was visible, holding only that way)."""
    import shutil
    import subprocess
    import sys
    import tempfile

    if not sandbox.enabled() or sandbox.bwrap_path() is None:
        pytest.skip("no bubblewrap on this machine")
    Path(place).mkdir(parents=True, exist_ok=True)
    checkout = Path(tempfile.mkdtemp(prefix="course-checkout-", dir=place))
    try:
        (checkout / "course_utils").mkdir()
        (checkout / "course_utils" / "__init__.py").write_text("")
        (checkout / "solutions").mkdir()  # beside the library: must not be seen
        monkeypatch.setattr(sandbox, "ROOT", checkout)
        chains = _chains(_bound_paths())
        assert chains[place] == [checkout.name] and chains[str(checkout)] == ["course_utils"]
        folder = sandbox.KernelFolder()
        try:
            conn = folder.path / "kernel.json"
            conn.write_text("{}")
            args = sandbox.command([sys.executable, "-c", CHAIN_PROBE % sorted(chains)],
                                   folder, conn, 2.0, 16.0, env=sandbox.environment())
            out = subprocess.run(args, capture_output=True, text=True, timeout=120)
        finally:
            folder.remove()
        assert out.returncode == 0, out.stderr
        import json

        assert json.loads(out.stdout) == chains
    finally:
        shutil.rmtree(checkout, ignore_errors=True)


# ------------------------------------------------------------------------------ collect


def test_collect_copies_regular_files_only_and_goes_on(tmp_path):
    """An inbox with a link to the repository's solution, a link to a folder, a named pipe, a
    2 GiB sparse file, a hidden file and an odd student name: each is skipped and named for its
    student, nothing blocks, and the students sorted after them are collected."""
    nb = ROOT / "assignments" / A / f"{A}.ipynb"
    src = tmp_path / "inbox"
    (src / "ann" / A).mkdir(parents=True)
    shutil.copy(nb, src / "ann" / A / f"{A}.ipynb")
    os.symlink(ROOT / "solutions" / A / f"{A}.ipynb", src / "ann" / A / "answers.ipynb")
    os.symlink(ROOT / "solutions", src / "ann" / A / "solutions")
    os.mkfifo(src / "ann" / A / "pipe")
    with open(src / "ann" / A / "sparse.bin", "wb") as f:
        f.truncate(2 * 2**30)
    (src / "ann" / A / ".hidden").write_text("x")
    (src / "bob").mkdir()
    os.symlink(ROOT / "solutions" / A / f"{A}.ipynb", src / "bob" / f"{A}.ipynb")
    os.symlink(ROOT / "solutions", src / "carl")  # a student folder that is a link
    (src / "dan\nx").mkdir()
    (src / "zoe").mkdir()
    shutil.copy(nb, src / "zoe" / f"{A}.ipynb")
    data = tmp_path / "data"
    got = workflow.collect(src, A, data=data)
    assert got == {A: ["ann", "bob", "zoe"]}
    ann = data / "submitted" / "ann" / A
    assert sorted(p.name for p in ann.iterdir()) == [f"{A}.ipynb"]
    assert all(not p.is_symlink() for p in (data / "submitted").rglob("*"))
    skipped = "\n".join(got.skipped["ann"])
    for words in ("answers.ipynb: a symbolic link", "solutions: a symbolic link",
                  "pipe: a fifo", "sparse.bin is 2,147,483,648 bytes", ".hidden"):
        assert words in skipped, skipped
    assert "symbolic link" in got.skipped["bob"][0]
    assert not (data / "submitted" / "bob" / A / f"{A}.ipynb").exists()
    assert "carl" in got.skipped and "'dan\\nx'" in got.skipped
    assert integrity.collect_log(A, data)["ann"] == got.skipped["ann"]
    assert (data / "submitted" / "zoe" / A / f"{A}.ipynb").read_bytes() == nb.read_bytes()


def test_grader_files_are_written_and_read_without_following_links(tmp_path):
    target = tmp_path / "victim"
    target.write_text("precious")
    link = tmp_path / "log.json"
    link.symlink_to(target)
    write_private(link, "{}")
    assert target.read_text() == "precious" and not link.is_symlink()
    os.mkfifo(tmp_path / "pipe")
    with pytest.raises(NotRegular, match="fifo"):
        read_regular(tmp_path / "pipe", 100)
    (tmp_path / "other").symlink_to(target)
    with pytest.raises(NotRegular, match="symbolic link"):
        read_regular(tmp_path / "other", 100)
    with open(tmp_path / "sparse", "wb") as f:
        f.truncate(10**9)
    with pytest.raises(NotRegular, match="more than"):
        read_regular(tmp_path / "sparse", 1000)


def test_a_changed_solution_refuses_to_grade(monkeypatch, tmp_path):
    """The reference must be the committed one: a changed solutions/ file is named."""
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    path = ROOT / "solutions" / A / f"{A}.ipynb"
    original = path.read_bytes()
    monkeypatch.delenv(integrity.SOLUTIONS_CHECK_ENV, raising=False)
    integrity.check_committed(A)  # as committed: fine
    try:
        path.write_bytes(original.replace(b"BEGIN SOLUTION", b"BEGIN SOLUTION ", 1))
        with pytest.raises(RuntimeError, match=f"solutions/{A}/{A}.ipynb"):
            integrity.check_committed(A)
        monkeypatch.setenv(integrity.SOLUTIONS_CHECK_ENV, "off")
        integrity.check_committed(A)
    finally:
        path.write_bytes(original)


def test_the_sandbox_command_starts_from_an_empty_root():
    folder = sandbox.KernelFolder()
    try:
        conn = folder.path / "kernel.json"
        conn.write_text("{}")
        args = sandbox.command(["python", "-f", str(conn)], folder, conn, 2.0, 16.0,
                               env=sandbox.environment())
    finally:
        folder.remove()
    assert args[args.index("--tmpfs") + 1] == "/" and "--clearenv" in args
    assert "--remount-ro" in args and ("--ro-bind", "/", "/") not in zip(args, args[1:], args[2:])
    assert args[-2:] == ["-f", sandbox.CONNECTION_FILE]
    binds = {args[i + 1] for i, a in enumerate(args) if a in ("--ro-bind", "--bind")}
    assert str(integrity.data_dir()) not in binds and str(Path.home()) not in binds
    assert str(ROOT) not in binds and str(ROOT / "course_utils") in binds
    assert [args[i + 1] for i, a in enumerate(args) if a == "--bind"] == [str(folder.sockets)]


def test_a_checkout_under_tmp_is_seen_inside_the_sandbox(tmp_path, monkeypatch):
    """The kernel's private /tmp (and HOME, and its working folder) are mounted before the
    interpreter and course_utils are bound: a checkout or a .venv under /tmp (where a fresh
    clone often is) stays visible inside, not hidden under the kernel's empty /tmp."""
    import subprocess
    import sys

    if not sandbox.enabled() or sandbox.bwrap_path() is None:
        pytest.skip("no bubblewrap on this machine")
    assert str(tmp_path).startswith("/tmp/")  # (pytest's tmp_path: the case to show)
    (tmp_path / "venv-marker").write_text("x")
    roots = sandbox._environment_roots()
    monkeypatch.setattr(sandbox, "_environment_roots", lambda: [*roots, tmp_path])
    folder = sandbox.KernelFolder()
    try:
        conn = folder.path / "kernel.json"
        conn.write_text("{}")
        args = sandbox.command([sys.executable, "-c", f"import os; print(os.listdir({str(tmp_path)!r}))"],
                               folder, conn, 2.0, 16.0, env=sandbox.environment())
        out = subprocess.run(args, capture_output=True, text=True, timeout=60)
    finally:
        folder.remove()
    assert out.returncode == 0, out.stderr
    assert "venv-marker" in out.stdout, out.stdout
