"""Drive a real JupyterLab in Debian's Chromium from pytest (Playwright, sync API).

Reusable pieces (see ``/work/shared/notes/jupyterlab-in-a-browser.md`` for why each exists):

* :class:`LabServer` - a context manager that starts an isolated ``jupyter lab`` (private HOME,
  JUPYTER_* and settings folders, a random token, a port the OS picks, the news pop-up turned
  off) serving a fresh temporary folder; :meth:`LabServer.add_file` / :meth:`add_notebook` put
  files there (never serve the repository itself: JupyterLab autosaves what it opens). On exit
  it shuts the server down through its REST API (then SIGTERM, if that is not heard) and checks that no kernel or other child
  process survives (:attr:`LabServer.survivors`; the fixture fails the test if any did).
* :func:`chromium` - a context manager yielding a Playwright ``Browser`` on /usr/bin/chromium.
* :func:`open_notebook`, :func:`wait_kernel_ready` (guards against the "false idle": toolbar
  idle before the kernel is connected), :func:`run_all`, :func:`wait_run_finished`,
  :func:`error_outputs`, :func:`screenshot` (into ``test-artifacts/``, git-ignored).
* pytest fixtures: ``lab_server`` (function scope), ``lab_browser`` (module scope) and
  ``lab_page`` (a tall 1400x1300 page). Import them into a test module::

      from jupyterlab_harness import lab_browser, lab_page, lab_server  # noqa: F401

Every browser test should carry ``@pytest.mark.browser`` and call :func:`require_chromium`
(or use the fixtures, which do), so it skips with a clear message when Chromium is missing.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Iterator

import pytest

ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "test-artifacts"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--disable-dev-shm-usage"]
KERNELSPEC = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}
_PROMPT_DONE = re.compile(r"^\[\d+\]:$")


def require_chromium() -> None:
    """Skip the calling test, saying why, when Debian's Chromium is not installed."""
    if not Path(CHROMIUM).exists():
        pytest.skip(f"browser tests need Chromium at {CHROMIUM}: "
                    "apt-get update && apt-get install -y chromium")


# ------------------------------------------------------------------------------------ server


class LabServer:
    """An isolated ``jupyter lab`` serving a temporary folder; use as a context manager."""

    def __init__(self, python: str = sys.executable, startup_timeout: float = 120.0,
                 extra_env: dict[str, str] | None = None, root_dir: Path | None = None,
                 windowing: bool = True):
        """``root_dir``: serve that folder (the repository, for the formgrader, which needs the
        course under the server's root) instead of a fresh one; open no notebook there.
        ``windowing=False``: render every cell of a notebook, not only those in view
        (JupyterLab 4's "windowing" leaves the prompts of cells out of view empty, and
        :func:`run_all` waits for every prompt to read ``[n]:``)."""
        self.serve = root_dir
        self.windowing = windowing
        self.python = python
        self.startup_timeout = startup_timeout
        self.extra_env = dict(extra_env or {})
        self.token = secrets.token_hex(16)
        self.proc: subprocess.Popen | None = None
        self.base: Path | None = None
        self.root_dir: Path | None = None
        self.port: int | None = None
        self.survivors: list[str] = []
        self.returncode: int | None = None

    # -- setup
    def _dirs(self) -> dict[str, Path]:
        assert self.base is not None
        names = ["home", "config", "data", "runtime", "settings", "workspaces", "ipython",
                 "mpl", "root"]
        dirs = {n: self.base / n for n in names}
        for d in dirs.values():
            d.mkdir(parents=True, exist_ok=True)
        notify = dirs["settings"] / "@jupyterlab" / "apputils-extension"
        notify.mkdir(parents=True, exist_ok=True)
        (notify / "notification.jupyterlab-settings").write_text(
            json.dumps({"fetchNews": "false", "checkForUpdates": False}))
        if not self.windowing:
            tracker = dirs["settings"] / "@jupyterlab" / "notebook-extension"
            tracker.mkdir(parents=True, exist_ok=True)
            (tracker / "tracker.jupyterlab-settings").write_text('{"windowingMode": "none"}')
        return dirs

    def env(self) -> dict[str, str]:
        """Environment with every per-user Jupyter/IPython/matplotlib folder made private."""
        d = self._dirs()
        env = dict(os.environ)
        env.update({
            "HOME": str(d["home"]), "JUPYTER_CONFIG_DIR": str(d["config"]),
            "JUPYTER_DATA_DIR": str(d["data"]), "JUPYTER_RUNTIME_DIR": str(d["runtime"]),
            "JUPYTERLAB_SETTINGS_DIR": str(d["settings"]),
            "JUPYTERLAB_WORKSPACES_DIR": str(d["workspaces"]), "IPYTHONDIR": str(d["ipython"]),
            "MPLCONFIGDIR": str(d["mpl"]), "JUPYTER_PLATFORM_DIRS": "1",
            "PYTHONPATH": os.pathsep.join([str(ROOT)] + [p for p in os.environ.get(
                "PYTHONPATH", "").split(os.pathsep) if p]),
        })
        env.pop("MPLBACKEND", None)  # the kernel must use the inline backend
        env.update(self.extra_env)
        return env

    def __enter__(self) -> "LabServer":
        self.base = Path(tempfile.mkdtemp(prefix="course-jlab-"))
        env = self.env()
        self.root_dir = self.serve or self.base / "root"
        self.log_path = self.base / "server.log"
        cmd = [self.python, "-m", "jupyterlab", "--no-browser", "--allow-root",
               "--ip=127.0.0.1", "--port=0", "--ServerApp.port_retries=0",
               f"--IdentityProvider.token={self.token}", f"--ServerApp.root_dir={self.root_dir}"]
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(cmd, env=env, cwd=self.root_dir, stdout=self._log,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        try:
            self._wait_started(Path(env["JUPYTER_RUNTIME_DIR"]))
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _wait_started(self, runtime: Path) -> None:
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"jupyter lab exited with {self.proc.returncode}:\n{self.log()}")
            infos = list(runtime.glob("jpserver-*.json"))
            if infos and self.port is None:
                try:
                    self.port = int(json.loads(infos[0].read_text())["port"])
                except (ValueError, KeyError):
                    pass
            if self.port:
                try:
                    self.api("GET", "api/status")
                    return
                except (urllib.error.URLError, ConnectionError):
                    pass
            time.sleep(0.3)
        raise TimeoutError(f"jupyter lab did not answer within {self.startup_timeout} s:\n{self.log()}")

    # -- use
    def url(self, path: str = "lab") -> str:
        """A browser URL on this server, token included."""
        sep = "&" if "?" in path else "?"
        return f"http://127.0.0.1:{self.port}/{path.lstrip('/')}{sep}token={self.token}"

    def api(self, method: str, path: str, body: dict | None = None, timeout: float = 30) -> object:
        """Call the REST API; returns the decoded JSON (None for an empty answer)."""
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}/{path.lstrip('/')}",
                                     data=data, method=method,
                                     headers={"Authorization": f"token {self.token}",
                                              "Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            raw = resp.read()
        return json.loads(raw) if raw else None

    def kernels(self) -> list[dict]:
        """The running kernels, as ``/api/kernels`` lists them."""
        return self.api("GET", "api/kernels")

    def add_file(self, src: str | Path, name: str | None = None) -> str:
        """Copy ``src`` into the served folder; returns its path relative to the root."""
        target = self.root_dir / (name or Path(src).name)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(src, target)
        return target.relative_to(self.root_dir).as_posix()

    def add_notebook(self, name: str, cells: list[str]) -> str:
        """Write a notebook of code cells (with a kernelspec, so no kernel dialog opens)."""
        import nbformat

        nb = nbformat.v4.new_notebook()
        nb.metadata["kernelspec"] = KERNELSPEC
        nb.cells = [nbformat.v4.new_code_cell(src) for src in cells]
        target = self.root_dir / name
        target.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, target)
        return target.relative_to(self.root_dir).as_posix()

    def log(self) -> str:
        """The server's output so far."""
        try:
            return self.log_path.read_text(errors="replace")[-5000:]
        except OSError:
            return ""

    # -- teardown
    def __exit__(self, *exc) -> None:
        import psutil

        children: list[psutil.Process] = []
        if self.proc is not None:
            try:
                children = psutil.Process(self.proc.pid).children(recursive=True)
            except psutil.NoSuchProcess:
                children = []
            if self.proc.poll() is None and self.port:
                try:
                    self.api("POST", "api/shutdown", timeout=10)
                except (urllib.error.URLError, ConnectionError, OSError):
                    pass
            # api/shutdown first; on a loaded machine the request itself can time out, so a
            # SIGTERM (the server's own graceful stop: it shuts its kernels down) follows it.
            # Only a server that ignores both is a survivor.
            for stop in (None, self.proc.terminate):
                if stop is not None and self.proc.poll() is None:
                    stop()
                try:
                    self.returncode = self.proc.wait(30)
                    break
                except subprocess.TimeoutExpired:
                    continue
            else:
                self.proc.kill()
                self.returncode = self.proc.wait(10)
                self.survivors.append(f"jupyter lab server pid {self.proc.pid} (killed); "
                                      f"its log ends:\n{self.log()[-1500:]}")
            gone, alive = psutil.wait_procs(children, timeout=15)
            for p in alive:  # only processes this server started
                with contextlib.suppress(psutil.Error):
                    self.survivors.append(f"pid {p.pid} {' '.join(p.cmdline()[:4])} (killed)")
                    p.kill()
            self._log.close()
        if self.base is not None:
            shutil.rmtree(self.base, ignore_errors=True)


class MakeLab:
    """``make lab``'s JupyterLab as a student starts it: ``scripts/lab.py`` under ``make`` (a
    Makefile whose ``lab`` recipe is the repository's, ``$(PY) scripts/lab.py``), in a process
    group of its own as a terminal's job is, on a workspace synced into a temporary folder, every
    per-user folder private (as :class:`LabServer` makes them, but no news setting: the student
    configuration must turn the pop-up off itself). Use as a context manager; :attr:`url` is the
    URL ``make lab`` printed, :attr:`lines` what it printed. On exit, whatever is left of it is
    killed and listed in :attr:`survivors`."""

    def __init__(self, workspace: Path, startup_timeout: float = 180.0):
        self.workspace = Path(workspace)
        self.startup_timeout = startup_timeout
        self.lines: list[str] = []
        self.url: str | None = None
        self.proc: subprocess.Popen | None = None
        self.survivors: list[str] = []
        self._seen: dict = {}  # every process of it ever listed (killing make breaks the tree)

    def env(self) -> dict[str, str]:
        base = self.workspace.parent / f"{self.workspace.name}-home"
        env = dict(os.environ)
        for var, name in (("HOME", "home"), ("JUPYTER_CONFIG_DIR", "config"),
                          ("JUPYTER_DATA_DIR", "data"), ("JUPYTERLAB_SETTINGS_DIR", "settings"),
                          ("JUPYTERLAB_WORKSPACES_DIR", "workspaces"), ("MPLCONFIGDIR", "mpl")):
            (base / name).mkdir(parents=True, exist_ok=True)
            env[var] = str(base / name)
        env.update({"COURSE_WORKSPACE": str(self.workspace), "JUPYTER_PLATFORM_DIRS": "1",
                    "PYTHONPATH": os.pathsep.join([str(ROOT)] + [p for p in os.environ.get(
                        "PYTHONPATH", "").split(os.pathsep) if p])})
        for var in ("MPLBACKEND", "COURSE_STUDENT", "JUPYTERHUB_USER", "JPY_SESSION_NAME"):
            env.pop(var, None)
        return env

    def __enter__(self) -> "MakeLab":
        makefile = self.workspace.parent / f"{self.workspace.name}.mk"
        makefile.write_text("lab:\n\t@$(PY) scripts/lab.py $(ARGS)\n")
        args = "--no-browser --ip=127.0.0.1 --port=0 --ServerApp.port_retries=0"
        self.proc = subprocess.Popen(
            ["make", "--no-print-directory", "-f", str(makefile), "lab", f"PY={sys.executable}",
             f"ARGS={args}"], cwd=ROOT, env=self.env(), stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
        deadline = time.monotonic() + self.startup_timeout
        try:
            while self.url is None:
                line = self.proc.stdout.readline()
                if not line or time.monotonic() > deadline:
                    raise RuntimeError("make lab did not start:\n" + "".join(self.lines))
                self.lines.append(line)
                found = re.search(r"Open (http\S+)", line)
                self.url = found.group(1) if found else None
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    @property
    def token(self) -> str:
        return self.url.rsplit("token=", 1)[1]

    def api(self, method: str, path: str, body: dict | None = None) -> object:
        base = self.url.split("/lab", 1)[0]
        req = urllib.request.Request(f"{base}/{path}", method=method,
                                     data=None if body is None else json.dumps(body).encode(),
                                     headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(req, timeout=30) as resp:
            raw = resp.read()
        return json.loads(raw) if raw else None

    def family(self) -> list:
        """Every process of ``make lab``: make, lab.py, JupyterLab, kernels, their children."""
        import psutil

        try:
            top = psutil.Process(self.proc.pid)
            found = [top] + top.children(recursive=True)
        except psutil.Error:
            return []
        self._seen.update({p.pid: p for p in found})
        return found

    def signal(self, sig: int, group: bool = False) -> None:
        """Send ``sig`` to make (or to its whole process group, as a terminal does)."""
        (os.killpg if group else os.kill)(self.proc.pid, sig)

    def __exit__(self, *exc) -> None:
        import psutil

        self.family()
        family = list(self._seen.values())
        if self.proc.poll() is None:
            with contextlib.suppress(OSError):
                os.killpg(self.proc.pid, 15)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(60)
        _, alive = psutil.wait_procs(family, timeout=10)
        for p in alive:  # only processes this make lab started
            with contextlib.suppress(psutil.Error):
                self.survivors.append(f"pid {p.pid} {' '.join(p.cmdline()[:4])} (killed)")
                p.kill()
        if self.proc.stdout:
            self.lines += self.proc.stdout.readlines()
            self.proc.stdout.close()


# ----------------------------------------------------------------------------------- browser


@contextlib.contextmanager
def chromium(headless: bool = True) -> Iterator[object]:
    """A Playwright ``Browser`` on Debian's Chromium, with its HOME in a temporary folder."""
    require_chromium()
    from playwright.sync_api import sync_playwright

    home = tempfile.mkdtemp(prefix="course-chromium-")
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, headless=headless,
                                         args=CHROMIUM_ARGS,
                                         env={**os.environ, "HOME": home})
            try:
                yield browser
            finally:
                browser.close()
    finally:
        shutil.rmtree(home, ignore_errors=True)


FRONT = ".jp-NotebookPanel:not(.lm-mod-hidden)"  # the notebook tab in front


def _session_kernel(server: LabServer, path: str) -> dict | None:
    for s in server.api("GET", "api/sessions"):
        if s.get("path") == path or s.get("notebook", {}).get("path") == path:
            return server.api("GET", f"api/kernels/{s['kernel']['id']}")
    return None


def wait_kernel_ready(page, server: LabServer, path: str, timeout_s: float = 120) -> dict:
    """Wait until the notebook's kernel is *really* idle and connected; returns its REST record.

    The toolbar says idle before the kernel is connected (a Run All then is silently dropped),
    so this also waits for the kernel name, "Idle" in the status bar, and a REST kernel that
    is idle with at least one connection.
    """
    deadline = time.monotonic() + timeout_s
    page.wait_for_selector(f"{FRONT} .jp-NotebookPanel-toolbar [data-jp-item-name=kernelName]",
                           timeout=timeout_s * 1000)
    while time.monotonic() < deadline:
        name = page.locator(f"{FRONT} .jp-NotebookPanel-toolbar "
                            "[data-jp-item-name=kernelName]").first
        status_bar = page.locator("#jp-main-statusbar").inner_text()
        indicator = page.locator(f"{FRONT} .jp-NotebookPanel-toolbar "
                                 "[data-jp-item-name=executionProgress] [data-status]")
        busy_ok = (indicator.count() == 0
                   or indicator.first.get_attribute("data-status") == "idle")
        kernel = _session_kernel(server, path)
        if (kernel and kernel.get("execution_state") == "idle"
                and kernel.get("connections", 0) >= 1 and busy_ok
                and "Idle" in status_bar and "No Kernel" not in name.inner_text()):
            return kernel
        time.sleep(0.3)
    raise TimeoutError(f"kernel for {path} not idle+connected within {timeout_s} s; "
                       f"status bar: {page.locator('#jp-main-statusbar').inner_text()!r}")


def open_notebook(page, server: LabServer, path: str, timeout_s: float = 120) -> dict:
    """Open ``path`` (relative to the server root) in JupyterLab and wait for a ready kernel."""
    page.goto(server.url(f"lab/tree/{path}"), wait_until="domcontentloaded",
              timeout=timeout_s * 1000)
    # (JupyterLab restores earlier tabs: wait for the cells of the notebook in front)
    page.wait_for_selector(f"{FRONT} .jp-Notebook .jp-Cell", timeout=timeout_s * 1000)
    return wait_kernel_ready(page, server, path, timeout_s)


def prompts(page) -> list[str]:
    """Input prompts of the code cells in the open notebook: ``[ ]:``, ``[*]:``, ``[3]:``."""
    return [t.strip() for t in page.locator(
        ".jp-NotebookPanel:not(.lm-mod-hidden) .jp-CodeCell .jp-InputPrompt").all_inner_texts()]


def run_all(page, timeout_s: float = 120) -> None:
    """Run > Run All Cells, check it really started, and wait until every cell has run."""
    page.get_by_role("menuitem", name="Run", exact=True).click()
    page.get_by_role("menuitem", name="Run All Cells").first.click()
    deadline = time.monotonic() + 15
    while prompts(page) and prompts(page)[0] == "[ ]:":
        if time.monotonic() > deadline:
            raise RuntimeError("Run All was dropped: the first prompt is still [ ]:")
        time.sleep(0.2)
    wait_run_finished(page, timeout_s)


def wait_run_finished(page, timeout_s: float = 120) -> None:
    """Wait until every code cell shows ``[n]:`` (none ``[*]:`` or ``[ ]:``)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = prompts(page)
        if got and all(_PROMPT_DONE.match(p) for p in got):
            return
        time.sleep(0.3)
    raise TimeoutError(f"cells still running after {timeout_s} s: prompts {prompts(page)}")


def error_outputs(page) -> list[str]:
    """Texts of error outputs (tracebacks) shown in the open notebook."""
    return page.locator(".jp-OutputArea-output[data-mime-type="
                        "'application/vnd.jupyter.error']").all_inner_texts()


def screenshot(page, name: str) -> Path:
    """Save a PNG of the page to ``test-artifacts/<name>.png``; returns its path."""
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path))
    return path


# ----------------------------------------------------------------------------------- fixtures


@pytest.fixture
def lab_server() -> Iterator[LabServer]:
    """A fresh isolated JupyterLab; fails the test if a kernel or child survives shutdown."""
    require_chromium()
    server = LabServer()
    with server:
        yield server
    assert not server.survivors, f"processes survived the server's shutdown: {server.survivors}"
    assert server.returncode == 0, f"jupyter lab exited with {server.returncode}:\n{server.log()}"


@pytest.fixture(scope="module")
def lab_browser():
    """One Chromium for the module's tests."""
    with chromium() as browser:
        yield browser


@pytest.fixture
def lab_page(lab_browser):
    """A tall page (the JupyterLab body does not scroll, so full-page shots do not help)."""
    context = lab_browser.new_context(viewport={"width": 1400, "height": 1300})
    page = context.new_page()
    try:
        yield page
    finally:
        context.close()
