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
FLOOD_S = 8    # message_flood's seconds of 0.5 MB messages (the grader once parsed them all)
GRADER_MB = 500  # the most a grading process may hold, whatever a kernel sends (issue 51)
PAGE_S = 5.0     # the slowest a page may be to open


@dataclass
class HostRun:
    cases: dict
    results: dict
    data: Path
    host: attacks.Host
    host_before: dict
    host_after: dict
    changed: list
    fallbacks: list


@pytest.fixture(scope="module")
def host_run(tmp_path_factory) -> HostRun:
    data = tmp_path_factory.mktemp("grading-host") / "data"
    data.mkdir()
    host = attacks.Host.make(tmp_path_factory.mktemp("instructor-home"), A)
    reference = integrity.reference_run(A, data, cache=REFERENCE_CACHE)
    honest = [(c, f) for c, f in synthetic.cases_for(A, reference) if c.kind == "correct"]
    # (the CPU hog and the slow honest student first: one in each worker, at the same time;
    # the notebook of a million objects through collect, as an instructor's collect gets it)
    cases = synthetic.hand_in(attacks.host_cases_for(A, host, data, MEMORY_GB, FLOOD_S)
                              + honest, data, A)
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
                   host_before, host.state(), changed, list(workflow.FEEDBACK_FALLBACKS))


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
                assert set(data) <= {"text/plain", "text/markdown", "image/png", "image/jpeg"}, (
                    path, data)
                assert all(inert.is_base64(v) for m, v in data.items() if m.startswith("image"))
                assert "<" not in data.get("text/markdown", "").replace("&lt;", "")
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
    assert len(notes) == 5, notes  # html, javascript, svg, latex, the forged png (markdown: kept
    # as text, its HTML escaped: a table of the course's own numbers is markdown, issue 50)
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
def test_no_kernel_reached_the_graders_files_or_settings(host_run):
    """Issue 51, findings 1 and 2, in the class's own run: the kernel that opened the kernel's
    settings for writing opened none, and the one that wrote into every file it held open
    wrote into none of the grader's (its logs were once the kernel's stdout and stderr)."""
    from grading.grader_attacks import LOG_MARKER

    nb = nbformat.read(host_run.data / "autograded" / "root_knobs" / A / f"{A}.ipynb",
                       as_version=4)
    said = [o.get("text", "") for c in nb.cells for o in c.get("outputs", [])
            if "opened for writing" in o.get("text", "")]
    assert said == ["opened for writing: []\n"], said
    written = [str(p) for p in (host_run.data / "logs").rglob("*") if p.is_file()
               and LOG_MARKER.encode() in p.read_bytes()]
    assert written == []


@pytest.mark.slow
def test_no_grading_process_grows_or_spends_for_a_kernel(host_run):
    """Issue 51, findings 7 and 8: whatever its kernel sent (64 frames of 30 MiB in one
    message, 60 queued messages of 30 MiB, messages of 490,000 empty objects, 0.5 MB messages
    for seconds), no grading process held more than ``GRADER_MB`` (each notebook's judge log
    records its process's peak), and the flood cost the grader about what an honest notebook
    costs (it once cost its own length in CPU seconds: the relay drops it in the kernel's
    budget). The notebook of a million objects was collected without them."""
    from grading import judge

    costs = {kind: judge.read_grader_cost(judge.log_path(host_run.data, A, kind, A))
             for kind, r in host_run.results.items() if r.status == "graded"}
    assert set(costs) == set(host_run.cases), set(host_run.cases) - set(costs)
    over = {kind: c["peak_mb"] for kind, c in costs.items() if c["peak_mb"] > GRADER_MB}
    assert over == {}
    flood, honest = costs["message_flood"]["cpu_s"], costs["correct"]["cpu_s"]
    assert flood < honest + 1.5, (flood, honest, FLOOD_S)
    kept = (host_run.data / "submitted" / "metadata_objects" / A / f"{A}.ipynb").read_bytes()
    assert b"course_junk" not in kept and len(kept) < 200_000


@pytest.mark.slow
def test_every_graded_student_has_a_full_feedback_page(host_run):
    """Issue 51, finding 5: the GIF in a written answer (its attachment dropped, its reference
    with it), the markup prompt and the huge answer each get nbgrader's own page; no page fell
    back to the course's short one."""
    assert host_run.fallbacks == []
    page = (host_run.data / "feedback" / "gif_answer" / A / f"{A}.html").read_text()
    assert "My explanation, with a picture" in page and '<img alt="moving"' in page


@pytest.mark.slow
def test_the_gradebook_survives(host_run):
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{host_run.data / 'gradebook.db'}") as gb:
        assert {s.id for s in gb.students} >= set(host_run.cases)


ACTIVE_CONTENT = """(root) => {
    const found = [];
    const own = [location.protocol, "http:", "https:", "mailto:"];
    for (const el of document.querySelector(root).querySelectorAll("*")) {
        for (const a of el.attributes) {
            if (/^on/i.test(a.name)) found.push(`${el.tagName} ${a.name}`);
            if (/^\\s*(javascript|vbscript):/i.test(a.value)) found.push(`${el.tagName} ${a.name}`);
        }
        // a link as the browser reads it (entities decoded, escapes gone): its scheme
        if (el.tagName === "A" && el.hasAttribute("href") && !own.includes(el.protocol))
            found.push(`A href ${el.protocol}`);
        if (el.tagName === "IMG" && el.hasAttribute("src")
                && !/^data:image\\/(png|jpeg|gif|webp);base64,/.test(el.getAttribute("src")))
            found.push(`IMG src ${el.getAttribute("src").slice(0, 30)}`);
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

    import time

    student = "script_outputs"
    pages = [student, "gif_answer", "huge_answer", "forged_prompt", "correct"]
    with Gradebook(f"sqlite:///{host_run.data / 'gradebook.db'}") as gb:
        sids = {s: gb.find_submission_notebook(A, A, s).id for s in pages}
    pwned = ROOT / "test-artifacts" / f"pwned-{attacks.SCRIPT_MARKER}.txt"
    with chromium() as browser:
        page = browser.new_page()
        for who in pages:  # as the student opens it
            page.goto((host_run.data / "feedback" / who / A / f"{A}.html").as_uri())
            page.wait_for_timeout(1500 if who == student else 200)
            seen = page.evaluate(ACTIVE_CONTENT, "body")
            assert seen == {"ran": 0, "found": []}, (who, seen)
            _reads_as_a_page(page, "body", who)
        page.goto((host_run.data / "feedback" / student / A / f"{A}.html").as_uri())
        assert attacks.SCRIPT_MARKER in page.inner_text("body")
        with LabServer(root_dir=ROOT, extra_env={"COURSE_DATA": str(host_run.data)}) as server:
            took = {}
            for who in pages:  # as the instructor grades it
                start = time.monotonic()
                page.goto(server.url(f"formgrader/submissions/{sids[who]}/"))
                page.wait_for_selector("#notebook-container", timeout=60_000)
                took[who] = time.monotonic() - start
                page.wait_for_timeout(2000 if who == student else 300)
                seen = page.evaluate(ACTIVE_CONTENT, "#notebook-container")
                assert seen == {"ran": 0, "found": []}, (who, seen)
                _reads_as_a_page(page, "#notebook-container", who)
                if who == student:
                    text = page.inner_text("#notebook-container")
        assert max(took.values()) < PAGE_S, took
        assert attacks.SCRIPT_MARKER in text and "My explanation." in text
        with LabServer() as lab:
            raw = host_run.data / "submitted" / student / A / f"{A}.ipynb"
            path = lab.add_file(raw, f"{A}.ipynb")
            open_notebook(page, lab, path)
            page.wait_for_timeout(2000)
            assert page.evaluate("() => window.__course_pwned || 0") == 0
    assert not pwned.exists()


def _reads_as_a_page(page, root: str, who: str) -> None:
    """The course's text renders (issue 50): its headings are heading elements with their
    words, and no tag of a rendered cell is shown as text."""
    heads = page.evaluate(f"() => [...document.querySelector({root!r}).querySelectorAll("
                          f"'h1, h2')].map(h => h.textContent)")
    assert any("Assignment 1" in h for h in heads), (who, heads[:5])
    text = page.inner_text(root)
    assert "<h1" not in text and "<p>" not in text and "</h2>" not in text, who


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


def _graded_cell_prints(source: str, folder: Path):
    """What one cell prints (JSON) when the grader runs it, as it runs a submission's."""
    import json

    from grading.preprocessors import RecoveringExecute

    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    nb.cells = [nbformat.v4.new_code_cell(source)]
    RecoveringExecute(timeout=60, startup_timeout=120).preprocess(
        nb, {"metadata": {"path": str(folder)}})
    return json.loads(nb.cells[0].outputs[0]["text"])


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
    seen = _graded_cell_prints(probe, tmp_path)
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


KNOBS_PROBE = r"""
import json, os
opened = []
def try_open(path):
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_NOFOLLOW))
        opened.append(path)
    except OSError:
        pass
for top, _, files in os.walk("/proc/sys"):
    for name in files:
        try_open(os.path.join(top, name))
for name in os.listdir("/proc"):
    if not name.isdigit() and name not in ("self", "thread-self"):
        path = "/proc/" + name
        if os.path.isfile(path):
            try_open(path)
try_open("/proc/sysrq-trigger")
fds = {}
for fd in os.listdir("/proc/self/fd"):
    try:
        fds[fd] = os.readlink("/proc/self/fd/" + fd)
    except OSError:
        pass
print(json.dumps({"uid": os.getuid(), "euid": os.geteuid(), "opened": opened, "fds": fds,
                  "caps": [l.split()[1] for l in open("/proc/self/status")
                           if l.startswith(("CapEff", "CapPrm"))]}))
"""


@pytest.mark.slow
def test_a_graded_kernel_is_no_root_and_holds_no_file_of_the_host(tmp_path):
    """Issue 51, findings 1 and 2, however the grader runs (root here): a graded cell is not
    uid 0 and has no capability, it can open no kernel setting for writing (every file under
    /proc/sys, /proc/sysrq-trigger, /proc's own files), and every file descriptor it holds is
    /dev/null, a pipe, a socket or an anonymous inode: none is a file of the host (its stdout
    and stderr were once the grading worker's log)."""
    if not sandbox.enabled() or sandbox.bwrap_path() is None:
        pytest.skip("no bubblewrap on this machine")
    seen = _graded_cell_prints(KNOBS_PROBE, tmp_path)
    assert seen["uid"] != 0 and seen["euid"] != 0, seen["uid"]
    assert seen["caps"] == ["0000000000000000"] * 2, seen["caps"]
    assert seen["opened"] == []
    files = {fd: t for fd, t in seen["fds"].items() if t != "/dev/null"
             and not t.startswith(("pipe:", "socket:", "anon_inode:"))}
    assert files == {}


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
        # (the running checkout's own .venv may live under the same folder: issue 50)
        own = {Path(p).relative_to(place).parts[0] for p in sandbox._environment_roots()
               if Path(p).is_relative_to(place)}
        assert chains[place] == sorted({checkout.name} | own)
        assert chains[str(checkout)] == ["course_utils"]
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


def test_collect_keeps_a_notebook_the_grader_can_read(tmp_path):
    """Issue 51, finding 7: a notebook of 1.2 million empty objects in its metadata is
    collected without them (every later step once parsed them: 1.5-3 GiB each), an honest one
    byte for byte; one that is still too complex without its metadata is refused with the
    count, at collect and, put in the submitted folder by other means, at autograde."""
    import json

    from grading import course
    from grading.grader_attacks import with_junk_metadata

    nb = nbformat.read(ROOT / "assignments" / A / f"{A}.ipynb", as_version=4)
    honest = nbformat.writes(nb).encode()
    assert course.submitted_notebook(honest) == honest
    junk = with_junk_metadata(nb).encode()
    kept = course.submitted_notebook(junk)
    assert b"course_junk" not in kept and json.loads(kept)["cells"] == json.loads(honest)["cells"]
    crowded = nbformat.from_dict(nb)
    crowded.cells[0].source = "x"
    crowded.cells[0].outputs = []
    crowded.cells.append(nbformat.v4.new_code_cell("1"))
    crowded.cells[-1].outputs = [nbformat.from_dict({"output_type": "display_data",
                                 "metadata": {}, "data": {"application/json": [[]] * 150_000}})]
    with pytest.raises(course.NotebookTooComplex, match="JSON items"):
        course.submitted_notebook(nbformat.writes(crowded).encode())
    with pytest.raises(course.NotebookTooComplex, match="JSON items"):
        course.submitted_notebook(b"[" + b"{}," * 3_000_000 + b"{}]")  # (not even parsed)
    student = tmp_path / "submitted" / "eve" / A
    student.mkdir(parents=True)
    nbformat.write(crowded, student / f"{A}.ipynb")
    why = workflow._too_complex(A, tmp_path, ["eve", "nobody"])
    assert list(why) == ["eve"] and "JSON items" in why["eve"]


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
    """The reference must be the committed one: a changed solutions/ file is named. Tried on a
    git copy of the assignment's files, never on this checkout's own (a grading test running
    beside it would see the change)."""
    import subprocess

    from grading import course, judge, reference

    files = [Path("solutions") / A / name for name in course.notebook_names(A)]
    files.append(Path("authoring") / "judges" / f"{A}.py")
    for rel in files:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ROOT / rel, tmp_path / rel)
    for args in (["init", "-q"], ["add", "-A"],
                 ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "copy"]):
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True)
    for module in (reference, course):
        monkeypatch.setattr(module, "ROOT", tmp_path)
    monkeypatch.setattr(judge, "JUDGES", tmp_path / "authoring" / "judges")
    monkeypatch.delenv(integrity.SOLUTIONS_CHECK_ENV, raising=False)
    integrity.check_committed(A)  # as committed: fine
    path = tmp_path / "solutions" / A / f"{A}.ipynb"
    path.write_bytes(path.read_bytes().replace(b"BEGIN SOLUTION", b"BEGIN SOLUTION ", 1))
    with pytest.raises(RuntimeError, match=f"solutions/{A}/{A}.ipynb"):
        integrity.check_committed(A)
    monkeypatch.setenv(integrity.SOLUTIONS_CHECK_ENV, "off")
    integrity.check_committed(A)


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
    tmp_path.chmod(0o755)  # (as a virtual environment is made; pytest makes its folders 0700)
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


def test_no_student_on_the_roster_vanishes(tmp_path):
    """Issue 50, finding 3: a student whose notebook is misnamed (``Untitled.ipynb``) and one
    on the roster who handed in nothing are named by collect and appear in the report with
    their status (the misnamed one vanished from every report and export)."""
    from grading import report

    data = tmp_path / "data"
    (data / "logs").mkdir(parents=True)
    (data / "roster.csv").write_text("id,first_name,last_name,email\nann,Ann,A,\nhank,Hank,H,\n"
                                     "ivy,Ivy,I,\n")
    inbox = tmp_path / "inbox"
    for student, name in (("ann", f"{A}.ipynb"), ("hank", "Untitled.ipynb")):
        (inbox / student).mkdir(parents=True)
        (inbox / student / name).write_bytes(
            (ROOT / "assignments" / A / f"{A}.ipynb").read_bytes())
    got = workflow.collect(inbox, A, data)
    assert got[A] == ["ann"]
    assert got.missing[A] == {"hank": f"notebook {A}.ipynb missing (found Untitled.ipynb)",
                              "ivy": "no submission"}
    statuses = {r.student: r.status for r in report.verify_assignment(A, data)}
    assert statuses["hank"] == (f"not graded: no submission (notebook {A}.ipynb missing "
                                f"(found Untitled.ipynb))")
    assert statuses["ivy"] == "not graded: no submission"
    assert set(statuses) == {"ann", "hank", "ivy"}
