"""The class on a real JupyterHub (issue 47): scripts/hub.py brings up JupyterHub 6 with its
real proxy (configurable-http-proxy), authenticator (FirstUseAuthenticator, first passwords
given), spawner (each student's server as their own Unix user, in a bubblewrap sandbox and
cgroups) and nbgrader's exchange. Three students: two do an assignment (one right, one with the
typical mistake), the third tries every crossing.

Needs root, bubblewrap and the proxy (`make setup` installs it where npm is): as CI has them.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest

from conftest import ROOT
from hub.client import RunningHub, login, open_lab, run_code, run_lecture, server_api, xsrf

A = "a1_training_state"
STUDENTS = ("dtpt-ann", "dtpt-bo", "dtpt-mal")  # right, typical mistake, the one who attacks
PROXY = ROOT / ".venv" / "node" / "node_modules" / ".bin" / "configurable-http-proxy"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0, reason="the hub makes Unix accounts: root only"),
    pytest.mark.skipif(not PROXY.exists(), reason="configurable-http-proxy is not installed "
                                                  "(make setup does it where npm is)"),
]


def browser_login(page, hub: RunningHub, user: str) -> None:
    """Log in through the hub's login page in Chromium."""
    page.goto(f"{hub.url}/hub/login")
    page.fill("#username_input", user)
    page.fill("#password_input", hub.passwords[user])
    page.click("#login_submit")


def assignment_list(page) -> None:
    """Open nbgrader's Assignment List from JupyterLab's Nbgrader menu."""
    page.click("#jp-MainMenu >> text=Nbgrader")
    menu = page.inner_text(".lm-Menu")
    assert "Formgrader" not in menu and "Assignment List" in menu, menu
    page.click(".lm-Menu >> text=Assignment List")


@pytest.fixture(scope="module", params=["local", "slurm"])
def hub(request, tmp_path_factory):
    """The hub, its students' servers processes of this machine, or Slurm jobs on a real
    one-node Slurm (scripts/slurm_local.sh) through batchspawner."""
    from hub import accounts

    for s in STUDENTS:
        accounts.remove_account(s)
    env, slurm_dir = {}, None
    if request.param == "slurm":
        slurm_dir = tmp_path_factory.mktemp("slurm")
        # (a server holds its CPU while it runs: 1 each, three students, on a 2-CPU machine)
        started = subprocess.run([str(ROOT / "scripts" / "slurm_local.sh"), "start",
                                  str(slurm_dir)], capture_output=True, text=True, timeout=120,
                                 env=dict(os.environ, SLURM_LOCAL_CPUS="8"))
        if started.returncode == 3:
            pytest.skip(started.stderr.strip())
        assert started.returncode == 0, started.stdout + started.stderr
        env = {"SLURM_CONF": str(slurm_dir / "slurm.conf")}
    try:
        h = RunningHub(tmp_path_factory.mktemp("hub"), STUDENTS, spawner=request.param, env=env)
        try:
            yield h
        finally:
            if h.proc.poll() is None:
                h.stop()
    finally:
        for s in STUDENTS:
            subprocess.run(["pkill", "-KILL", "-u", s], capture_output=True)
            accounts.remove_account(s)
        if slurm_dir is not None:
            subprocess.run([str(ROOT / "scripts" / "slurm_local.sh"), "stop", str(slurm_dir)],
                           capture_output=True, timeout=120)


_JS = ("window.top.__course_pwned = (window.top.__course_pwned || 0) + 1; "
       "fetch('/services/formgrader/api/contents/test-artifacts/pwned-through-the-hub.txt', "
       "{method: 'PUT', headers: {'X-XSRFToken': (document.cookie.match(/_xsrf=([^;]+)/) || "
       "[])[1] || '', 'Content-Type': 'application/json'}, body: JSON.stringify({type: 'file', "
       "format: 'text', content: 'written by a student'})})")
_HTML = f"<script>{_JS}</script><img src=x onerror=\"{_JS.replace(chr(34), '&quot;')}\">"
PAYLOAD = ("from IPython.display import HTML, Javascript, display\n"
           f"display(HTML({_HTML!r}))\ndisplay(Javascript({_JS!r}))\n")


def _answer_notebooks() -> dict[str, nbformat.NotebookNode]:
    from grading import synthetic

    cases = {c.kind: (c, files) for c, files in synthetic.cases_for(A)}
    return {"right": cases["honest_1"][1][f"{A}.ipynb"],
            "mistake": cases["typical_mistake"][1][f"{A}.ipynb"]}


def test_a_term_on_the_hub_and_every_crossing_refused(hub):
    ann, bo, mal = STUDENTS
    # no one logs in with a wrong password, nor claims an account by logging in first
    wrong = login(hub, ann, "not-the-password-at-all")
    assert wrong.get(f"{hub.url}/hub/api/user").status_code in (401, 403)
    from jupyterlab_harness import chromium

    with chromium() as browser:
        _term(hub, browser)


def _term(hub: RunningHub, browser) -> None:
    ann, bo, mal = STUDENTS
    sessions = {u: login(hub, u) for u in STUDENTS}
    # ann and bo do what a student does in Chromium, each in a browser of their own: log in,
    # JupyterLab, the Assignments tab (mal uses the same server APIs directly)
    pages = {}
    for u in (ann, bo):
        pages[u] = browser.new_context(viewport={"width": 1300, "height": 850}).new_page()
        browser_login(pages[u], hub, u)
    for u, page in pages.items():
        page.wait_for_selector("#jp-main-dock-panel", timeout=120_000)
        assert page.url.endswith(f"/user/{u}/lab"), page.url
    for s in sessions.values():
        open_lab(hub, s)
    hub.step("release", A)
    # limits of the student's own: 3 GiB, 1 CPU (here, cgroups; on Slurm, the job's request)
    uid = pwd.getpwnam(ann).pw_uid
    server = [p for p in Path("/proc").iterdir() if p.name.isdigit() and p.stat().st_uid == uid
              and b"jupyterhub-singleuser" in (p / "cmdline").read_bytes()]
    # no file of the host is the server's stdin, stdout or stderr (the hub's log, the job's)
    assert [os.readlink(server[0] / "fd" / str(fd)) for fd in (0, 1, 2)] == ["/dev/null"] * 3
    if hub.spawner == "slurm":
        job = subprocess.run(["squeue", "-h", "-n", f"dtp-{ann}", "-o", "%T %m %C"],
                             env=hub.env, capture_output=True, text=True).stdout.split()
        assert job == ["RUNNING", "3G", "1"], job
    else:
        groups = dict(line.split(":", 2)[1:] for line in (server[0] / "cgroup").read_text().split())
        memory = Path("/sys/fs/cgroup/memory") / groups["memory"].lstrip("/")
        assert int((memory / "memory.limit_in_bytes").read_text()) == 3 << 30
        cpu = Path("/sys/fs/cgroup/cpu") / next(
            v for k, v in groups.items() if "cpu" in k.split(",")).lstrip("/")
        quota, period = (int((cpu / f"cpu.cfs_{k}_us").read_text()) for k in ("quota", "period"))
        assert quota == period
    for page in pages.values():
        assignment_list(page)
        page.click("#released_assignments_list >> button:has-text('Fetch')", timeout=30_000)
        page.wait_for_selector("#fetched_assignments_list >> button:has-text('Submit')",
                               timeout=30_000)

    # each student's server is their own Unix user, with their own numbers
    for u, s in sessions.items():
        if u not in pages:
            got = server_api(hub, s, "POST", "assignments/fetch",
                             data={"assignment_id": A, "course_id": "dtp"})
            assert got.status_code == 200 and got.json()["success"], got.text
        out, err = run_code(hub, s, "import os, getpass, pwd\nfrom course_utils import variants\n"
                                    f"print(getpass.getuser(), pwd.getpwuid(os.getuid())[0], "
                                    f"variants.identity(), "
                                    f"os.path.exists({str(hub.state / 'private')!r}), "
                                    f"os.path.exists({str(ROOT / 'solutions')!r}))")
        assert (out.split(), err) == ([u, u, u, "False", "False"], "")
        assert f"{A}.ipynb" in {c["name"] for c in server_api(
            hub, s, "GET", f"api/contents/{A}").json()["content"]}
    from course_utils.assess import variants

    assert variants.givens(A, student=ann) != variants.givens(A, student=bo)

    # lecture 1 runs top to bottom in each student's server (their sandbox, their limits)
    for u in pages:
        finished, _, why = run_lecture(hub, sessions[u])
        assert finished, (u, why)

    # answer (the right one; the typical mistake) and submit through the Assignments API
    notebooks = _answer_notebooks()
    # bo's notebook also shows pages of script (issue 41), to be opened by the instructor in
    # the formgrader through the hub: in the staff's session on the hub's origin
    notebooks["mistake"].cells.append(nbformat.v4.new_code_cell(PAYLOAD))
    for u, kind in ((ann, "right"), (bo, "mistake")):
        s = sessions[u]
        put = server_api(hub, s, "PUT", f"api/contents/{A}/{A}.ipynb",
                         json={"type": "notebook", "format": "json",
                               "content": json.loads(nbformat.writes(notebooks[kind]))})
        assert put.status_code in (200, 201), put.text
        pages[u].click("#fetched_assignments_list >> button:has-text('Submit')")
        pages[u].wait_for_selector(f"#submitted_assignments_list >> text={A}", timeout=30_000)

    # the third student tries every crossing from their own kernel
    inbound = hub.state / "exchange" / "dtp" / "inbound"
    out, err = run_code(hub, sessions[mal], f"""
import os, subprocess, sys, urllib.request, urllib.error
def tried(f):
    try:
        f()
        return "OPEN"
    except (OSError, urllib.error.URLError) as e:
        return type(e).__name__
print("home", tried(lambda: os.listdir({str(hub.homes / ann)!r})))
print("inbound", tried(lambda: os.listdir({str(inbound)!r})))
for name in ("jupyterhub.sqlite", "jupyterhub_cookie_secret", "passwords.dbm", "handout.csv"):
    print(name, tried(lambda: open(os.path.join({str(hub.state / 'private')!r}, name)).read()))
print("data", tried(lambda: os.listdir({str(hub.data)!r})))
print("repo", tried(lambda: open({str(ROOT / 'solutions' / A / (A + '.ipynb'))!r}).read()))
print("repo-holds", ",".join(sorted(os.listdir({str(ROOT)!r}))))
r = subprocess.run(["nbgrader", "submit", "{A}", "--student", "{ann}"], capture_output=True,
                   text=True, cwd=os.path.expanduser("~/workspace"))
print("submit-as-ann", r.returncode)
""")
    seen = dict(line.split(" ", 1) for line in out.strip().splitlines())
    assert err == "" and seen.pop("submit-as-ann") == "0", out + err  # (nbgrader lets it through)
    assert seen.pop("repo-holds") == ".venv", seen  # (the environment, bound read-only)
    assert all(v in ("FileNotFoundError", "PermissionError") for v in seen.values()), seen
    assert seen["inbound"] == "PermissionError"
    assert os.stat(hub.homes / ann).st_mode & 0o777 == 0o700
    # another student's server and the formgrader: refused through the hub's proxy
    assert sessions[mal].get(f"{hub.url}/user/{ann}/api/contents").status_code == 403
    assert sessions[mal].get(f"{hub.url}/services/formgrader/formgrader").status_code == 403
    hub_xsrf = xsrf(sessions[mal], "/hub/")
    start = sessions[mal].post(f"{hub.url}/hub/api/users/{ann}/server",
                               headers={"X-XSRFToken": hub_xsrf})
    assert start.status_code in (403, 404) and "No access" in start.text, start.text
    users = sessions[mal].get(f"{hub.url}/hub/api/users", headers={"X-XSRFToken": hub_xsrf})
    assert users.status_code == 403 or [u["name"] for u in users.json()] == [mal], users.text

    # the instructor collects (the submission handed in as ann by mal is refused), grades,
    # releases feedback
    said = hub.step("collect", A)
    assert f"collected 2 submission(s)" in said, said
    assert re.search(rf"REFUSED {ann}\+{A}\+.*by '{mal}'", said), said
    assert f"{mal}: no submission" in said
    graded = subprocess.run([sys.executable, str(ROOT / "scripts" / "grade.py"), "autograde", A],
                            env=hub.env, capture_output=True, text=True, timeout=900)
    assert graded.returncode == 0, graded.stdout + graded.stderr
    said = hub.step("feedback", A)
    assert "feedback released to 2 student(s)" in said, said

    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{hub.data / 'gradebook.db'}") as gb:
        bo_view = gb.find_submission_notebook(A, A, bo).id
    staff = browser.new_context().new_page()
    browser_login(staff, hub, "instructor")  # (lands on the formgrader, the course's config)
    staff.wait_for_selector(f"text={A}", timeout=60_000)
    assert "/services/formgrader/" in staff.url, staff.url
    # (its own exchange buttons are off: the hub's steps check who handed in what)
    assert "use-scripts-hub.py-release-collect-feedback" in staff.inner_text("body")
    staff.goto(f"{hub.url}/services/formgrader/formgrader/manage_submissions/{A}")
    staff.wait_for_selector(f"text={ann}", timeout=30_000)
    listed = staff.inner_text("body")
    assert bo in listed and mal not in listed, listed
    staff.goto(f"{hub.url}/services/formgrader/formgrader/submissions/{bo_view}/")
    staff.wait_for_selector("#notebook-container", timeout=60_000)
    staff.wait_for_timeout(2000)
    assert staff.evaluate("() => window.__course_pwned || 0") == 0
    assert "the grader removed" in staff.inner_text("#notebook-container")
    assert not (ROOT / "test-artifacts" / "pwned-through-the-hub.txt").exists()
    instructor = login(hub, "instructor")
    assert instructor.get(f"{hub.url}/user/{ann}/api/contents").status_code == 403

    # each student fetches their own feedback: their score, their message
    for u, score, message in ((ann, "10.0 / 10.0", None), (bo, "8.0 / 10.0",
                                                           "that is GiB (2**30 bytes)")):
        s = sessions[u]
        page = pages[u]
        page.click("#submitted_assignments_list >> button:has-text('Fetch Feedback')")
        page.wait_for_selector("#submitted_assignments_list >> text=view feedback",
                               timeout=30_000)
        listing = server_api(hub, s, "GET", f"api/contents/{A}/feedback").json()["content"]
        stamp = listing[0]["name"]
        html = server_api(hub, s, "GET", f"api/contents/{A}/feedback/{stamp}/{A}.html"
                          ).json()["content"]
        assert score in html, (u, re.findall(r"\d+\.\d / \d+\.\d", html))
        if message:
            assert message in html
        # (the page as the student's browser shows it, from their own server)
        page.goto(f"{hub.url}/user/{u}/files/{A}/feedback/{stamp}/{A}.html")
        assert score in page.inner_text("body")
        if message:
            assert message in page.inner_text("body")

    # Ctrl-C (SIGTERM): no hub, proxy, service or student process is left
    text = hub.stop()
    assert "no hub, proxy or student process is left" in text, text
    uids = {pwd.getpwnam(u).pw_uid for u in STUDENTS}
    left = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                cmd = (p / "cmdline").read_text()
                if p.stat().st_uid in uids or str(hub.state) in cmd or (
                        "configurable-http-proxy" in cmd and str(hub.port) in cmd):
                    left.append((p.name, (p / "cmdline").read_bytes()[:80]))
            except OSError:
                pass
    assert not left, left


def test_a_course_update_keeps_the_students_work_and_an_idle_server_is_culled(tmp_path):
    from hub import accounts

    student = "dtpt-cy"
    accounts.remove_account(student)
    hub = RunningHub(tmp_path, (student,), cull_timeout=20)
    try:
        s = login(hub, student)
        open_lab(hub, s)
        lecture = "lectures/01_training_state.ipynb"
        mine = server_api(hub, s, "GET", f"api/contents/{lecture}").json()["content"]
        mine["cells"].append(nbformat.v4.new_markdown_cell("my own notes"))
        assert server_api(hub, s, "PUT", f"api/contents/{lecture}",
                          json={"type": "notebook", "format": "json", "content": mine}).ok
        # idle: jupyterhub-idle-culler stops the server (20 s without activity)
        t0 = time.monotonic()
        while s.get(f"{hub.url}/hub/api/user", headers={"X-XSRFToken": xsrf(s, "/hub/")}
                    ).json()["servers"]:
            assert time.monotonic() - t0 < 120, "the idle server was not culled"
            time.sleep(2)
        assert "Culling server" in (hub.state / "private" / "jupyterhub.log").read_text()
        # the course changes: a lecture changed, a lecture added (hub.py update, as after a pull)
        assert "the course is updated" in hub.step("update")
        course = (hub.state / "course").resolve()
        old = json.loads((course / "notebooks" / "01_training_state.ipynb").read_text())
        old["cells"].append(nbformat.v4.new_markdown_cell("a correction from the course"))
        (course / "notebooks" / "01_training_state.ipynb").write_text(json.dumps(old))
        (course / "notebooks" / "14_added.ipynb").write_text(json.dumps(old))
        open_lab(hub, s)  # (the next start brings the workspace up to date)
        names = {c["name"] for c in server_api(hub, s, "GET", "api/contents/lectures"
                                               ).json()["content"]}
        assert "14_added.ipynb" in names
        kept = server_api(hub, s, "GET", f"api/contents/{lecture}").json()["content"]
        assert kept["cells"][-1]["source"] == "my own notes"
        assert "newer version of 1 of your notebooks" in (
            hub.state / "private" / "jupyterhub.log").read_text()
    finally:
        if hub.proc.poll() is None:
            hub.stop()
        subprocess.run(["pkill", "-KILL", "-u", student], capture_output=True)
        accounts.remove_account(student)


def test_the_guide_names_only_steps_the_hub_has_and_the_test_walks(capsys):
    """docs/instructor.md's term on the hub: every ``scripts/hub.py`` step it names is one of
    the script's (its ``--help`` exits 0; an unknown step exits 2), and the end-to-end tests
    above run the steps a term needs."""
    import importlib.util

    guide = (ROOT / "docs" / "instructor.md").read_text()
    section = guide[guide.index("## A class on JupyterHub"):guide.index("## When something")]
    named = set(re.findall(r"scripts/hub\.py (\w+)", section))
    assert {"up", "release", "collect", "feedback", "update", "password"} <= named, named
    spec = importlib.util.spec_from_file_location("hub_script", ROOT / "scripts" / "hub.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    for step in [*named, "no-such-step"]:
        with pytest.raises(SystemExit) as exit_:
            script.main([step, "--help"])
        assert exit_.value.code == (2 if step == "no-such-step" else 0), step
    walked = set(re.findall(r'hub\.step\("(\w+)"', Path(__file__).read_text()))
    assert {"release", "collect", "feedback", "update"} <= walked, walked
