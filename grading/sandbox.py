"""Grading kernels run in a sandbox: bubblewrap (``bwrap``), the tool Debian ships for this.

A student's answer runs as code in the grading kernel, on the instructor's own machine. The
sandbox gives that code an empty machine: nothing of the host exists inside but what the
interpreter needs (:data:`HOST_PATHS`, read-only), no environment variable but those of
:data:`ENVIRONMENT`, and no folder of the host that it can write, except the folder of its
own Jupyter sockets (below). ``SandboxedKernelManager`` starts each kernel as

    sh -c 'join the kernel's cgroups' --                  # pids.max, memory (tmpfs included)
    bwrap --unshare-all --cap-drop ALL --die-with-parent  # own PID/network/IPC/UTS/user ns
          --clearenv --setenv <ENVIRONMENT> ...           # nothing of the grader's environment
          --tmpfs /  ... --remount-ro /                   # an empty, read-only root
          --ro-bind <HOST_PATHS> ...                      # /usr, the loader's cache, fonts
          --ro-bind <interpreter prefixes> --ro-bind <repository>/course_utils
          --ro-bind <grader's etc/> /etc/{hosts,passwd,group}
          --ro-bind <connection file> /run/jupyter/kernel.json
          --tmpfs /tmp --tmpfs /home/student --tmpfs /submission   # RAM, counted in its memory
          --bind <its socket folder> ...                  # Jupyter's ipc sockets
          --chdir /submission
          prlimit --as --fsize --core python -m ipykernel_launcher -f /run/jupyter/kernel.json

What the kernel sees, and why each piece is there, is :func:`allowlist` (the instructor's guide
prints it). What it does not see: the instructor's home, other checkouts of the course, the
collect inbox, ``$COURSE_DATA`` (gradebook, reference runs, other students), this repository
apart from ``course_utils``, the grader's environment variables. Its own notebook is not there
either: nbclient sends it the cells as messages, and it needs no file of the submission.

What the kernel can write: ``/tmp``, ``/home/student`` and its working folder ``/submission``,
three tmpfs that exist only inside the sandbox (they vanish with it; the grader never reads
them), and its socket folder, which the grader makes per kernel under ``/dev/shm`` (so what a
kernel writes there is RAM charged to its memory cgroup, never the instructor's disk). The
grader only connects to the sockets in that folder and removes it afterwards (``rmtree``
follows no link); the files the grader writes for the kernel (``hosts``, ``passwd``, the
connection file) live in a folder of the grader's beside it, bound read-only.

Limits (each named in the report when it fires, :func:`describe_limits`):

* **Memory**: ``RLIMIT_AS`` (``memory_gb``): an allocation beyond it is a ``MemoryError`` in its
  cell. Where the machine has a writable memory cgroup (cgroup v1 ``memory`` or a delegated v2
  tree), the kernel and everything it starts, *files in its tmpfs and /dev/shm included*, are
  capped at the same size; past it the kernel is killed and restarted, and the cell says that
  the memory limit stopped it.
* **Files**: ``RLIMIT_FSIZE`` (``max_file_mb``): a larger file fails with ``EFBIG``; the total
  written is bounded by the memory cgroup (every writable folder is RAM).
* **Processes and threads**: a ``pids`` cgroup (``max_tasks``). ``RLIMIT_NPROC`` would not do:
  it never binds root.
* **Messages**: the grader's sockets refuse any single message over ``max_message_mb``
  (``ZMQ_MAXMSGSIZE``), so one print cannot make the grader hold gigabytes;
  ``grading.preprocessors.RecoveringExecute`` caps what it keeps per cell and per notebook.

Where ``bwrap`` is missing (macOS, or a Linux without the package) :func:`require` refuses to
grade unless the instructor allows unisolated grading explicitly (``COURSE_SANDBOX=off``); the
report then says that grading was not isolated.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import zmq
from jupyter_client.manager import AsyncKernelManager
from traitlets import Float, Int

from grading.files import write_private

ROOT = Path(__file__).resolve().parent.parent
SANDBOX_ENV = "COURSE_SANDBOX"  # "on" (default): bwrap required; "off": grade without isolation

# Inside the sandbox.
HOME = "/home/student"
WORKDIR = "/submission"
CONNECTION_FILE = "/run/jupyter/kernel.json"
HOSTNAME = "sandbox"

# Host paths bound read-only into the empty root (where they exist), and why.
HOST_PATHS: dict[str, str] = {
    "/usr": "the system's programs and shared libraries the interpreter links against",
    "/bin": "(a link to usr/bin on merged-/usr systems) /bin/sh for subprocesses",
    "/sbin": "(a link to usr/sbin on merged-/usr systems)",
    "/lib": "the dynamic loader and C library (a link to usr/lib on merged-/usr systems)",
    "/lib32": "32-bit libraries, where the system has them",
    "/lib64": "the dynamic loader's path on x86-64",
    "/libx32": "x32 libraries, where the system has them",
    "/etc/ld.so.cache": "where the dynamic loader finds shared libraries",
    "/etc/fonts": "fontconfig's settings (matplotlib asks for them at import)",
}

# The kernel's whole environment (``--clearenv``, then these), and why each is there.
ENVIRONMENT: dict[str, str] = {
    "PATH": "the kernel's interpreter first, then /usr/bin and /bin",
    "HOME": f"{HOME}, a private tmpfs",
    "LANG": "C.UTF-8: UTF-8 text in and out",
    "PYTHONPATH": "the repository root, so the course's course_utils is imported, never a "
                  "folder a student made",
    "PYTHONDONTWRITEBYTECODE": "the environment is read-only: no .pyc files",
    "TMPDIR": "/tmp, a private tmpfs",
    "MPLCONFIGDIR": "matplotlib's cache, in /tmp",
    "IPYTHONDIR": "IPython's profile, in /tmp",
    "JUPYTER_RUNTIME_DIR": "Jupyter's runtime files, in /tmp",
    "JUPYTER_PLATFORM_DIRS": "1: Jupyter's folders as the platform has them (no warning)",
    "COURSE_LAUNCH_PRELOAD": "copied from the grader (nbgrader_config.py sets 'light'): what "
                             "the course's rank launcher preloads",
    "OMP_NUM_THREADS": "copied from the grader where set: threads per process",
    "COURSE_TRACE_CHECKS": "copied from the grader where set (the reference run that builds "
                           "the release): visible checks publish what they saw",
    "COURSE_HIDDEN_CASES": "this submission's hidden inputs, drawn by the grader (see "
                           "grading/judge.py, hidden_cases)",
    "COURSE_STUDENT": "the student being graded (nbgrader's student id; empty: the base "
                      "numbers): course_utils.variants draws that student's givens from it, "
                      "whatever identity the notebook was written under",
}
_COPIED_ENV = ("COURSE_LAUNCH_PRELOAD", "OMP_NUM_THREADS", "COURSE_TRACE_CHECKS")


class SandboxUnavailable(RuntimeError):
    """Grading was asked to run isolated, but no sandbox tool is installed."""


def bwrap_path() -> str | None:
    """The ``bwrap`` executable, or None."""
    return shutil.which("bwrap")


def enabled() -> bool:
    """Is grading to run sandboxed (the default)?"""
    return os.environ.get(SANDBOX_ENV, "on").lower() not in ("off", "0", "no")


def require() -> None:
    """Raise :class:`SandboxUnavailable` unless kernels can be sandboxed or isolation is off."""
    if enabled() and bwrap_path() is None:
        raise SandboxUnavailable(
            "grading kernels run in a bubblewrap sandbox, but `bwrap` is not installed "
            "(Debian/Ubuntu: apt-get install bubblewrap). To grade WITHOUT isolation anyway "
            f"(a submission can then read solutions/ and change other results), set "
            f"{SANDBOX_ENV}=off; the report will say that grading was not isolated.")


# ------------------------------------------------------------------------------ cgroups


class KernelCgroups:
    """The kernel's own cgroups: at most ``max_tasks`` processes and threads, at most
    ``memory_bytes`` of memory (anonymous memory, page cache and tmpfs files alike).

    cgroup v1 (``/sys/fs/cgroup/pids``, ``/sys/fs/cgroup/memory``) or a writable v2 tree with
    the controllers delegated; whichever of the two limits the machine cannot give is left out
    (:attr:`limits` says which apply).
    """

    def __init__(self, max_tasks: int, memory_bytes: int):
        self.groups: list[Path] = []
        self.limits: list[str] = []
        self._memory: Path | None = None
        self._v2 = False
        sweep_orphan_cgroups()
        # the creating process's pid in the name: a group whose creator was killed (a grading
        # worker or Slurm task stopped at its time limit) is found and removed by the next one
        name = f"{CGROUP_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:8]}"
        v2 = Path("/sys/fs/cgroup")
        if (v2 / "cgroup.controllers").exists():
            controllers = set((v2 / "cgroup.subtree_control").read_text().split()) \
                if (v2 / "cgroup.subtree_control").exists() else set()
            group = self._make(v2 / name)
            if group is not None:
                self._v2 = True
                if "pids" in controllers and self._write(group / "pids.max", max_tasks):
                    self.limits.append("pids")
                if "memory" in controllers and self._write(group / "memory.max", memory_bytes):
                    self._write(group / "memory.swap.max", 0)
                    self._memory = group
                    self.limits.append("memory")
                if not self.limits:
                    self.remove()
            return
        pids = self._make(v2 / "pids" / name)
        if pids is not None:
            if self._write(pids / "pids.max", max_tasks):
                self.limits.append("pids")
            else:
                self._drop(pids)
        memory = self._make(v2 / "memory" / name)
        if memory is not None:
            if self._write(memory / "memory.limit_in_bytes", memory_bytes):
                self._write(memory / "memory.memsw.limit_in_bytes", memory_bytes)  # no swap
                self._memory = memory
                self.limits.append("memory")
            else:
                self._drop(memory)

    def _make(self, path: Path) -> Path | None:
        try:
            path.mkdir()
        except OSError:
            return None
        self.groups.append(path)
        return path

    def _drop(self, path: Path) -> None:
        self.groups.remove(path)
        _rmdir(path)

    @staticmethod
    def _write(path: Path, value: int) -> bool:
        try:
            path.write_text(str(int(value)))
            return True
        except OSError:
            return False

    def procs_files(self) -> list[Path]:
        """The ``cgroup.procs`` file of each group (a process joins by writing its pid)."""
        return [g / "cgroup.procs" for g in self.groups]

    def oom_kills(self) -> int:
        """How many processes the memory limit has killed so far (0 without the limit)."""
        if self._memory is None:
            return 0
        name = "memory.events" if self._v2 else "memory.oom_control"
        try:
            for line in (self._memory / name).read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        except (OSError, ValueError):
            pass
        return 0

    def peak_bytes(self) -> int | None:
        """The most memory the group has used (v1's max_usage, v2's memory.peak), if known."""
        if self._memory is None:
            return None
        name = "memory.peak" if self._v2 else "memory.max_usage_in_bytes"
        try:
            return int((self._memory / name).read_text())
        except (OSError, ValueError):
            return None

    def remove(self) -> None:
        """Remove the groups (their processes have ended; the kernel takes a moment to agree)."""
        for group in self.groups:
            _rmdir(group)
        self.groups = []


CGROUP_PREFIX = "course-kernel-"
CGROUP_ROOTS = (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/pids"), Path("/sys/fs/cgroup/memory"))
LEGACY_CGROUP_AGE_S = 900  # a group named without its creator's pid (older course versions)
PID_MAX = 2**22  # Linux's largest pid_max: a larger "pid" in a name is no pid (os.kill overflows)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        pass
    return True


def sweep_orphan_cgroups(roots: tuple[Path, ...] = CGROUP_ROOTS) -> list[Path]:
    """Remove kernel cgroups that a killed grading process left behind; the removed paths.

    A group is removed only when it has no process left and its creator (the pid in its name)
    has ended; a group named another way (no pid) only when empty and older than
    :data:`LEGACY_CGROUP_AGE_S`. A group in use is never touched (the kernel refuses to remove
    a cgroup with processes in it anyway).
    """
    removed = []
    for root in roots:
        try:
            groups = [g for g in root.iterdir() if g.name.startswith(CGROUP_PREFIX)]
        except OSError:
            continue
        for group in groups:
            creator, _, _ = group.name[len(CGROUP_PREFIX):].partition("-")
            try:
                if creator.isdigit() and int(creator) <= PID_MAX:
                    if _alive(int(creator)):
                        continue
                elif time.time() - group.stat().st_mtime < LEGACY_CGROUP_AGE_S:
                    continue
                if (group / "cgroup.procs").read_text().strip():
                    continue
                group.rmdir()
            except OSError:  # gone meanwhile, or busy: leave it
                continue
            removed.append(group)
    return removed


def _rmdir(group: Path) -> None:
    for _ in range(20):
        try:
            group.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.05)


_LIMITS_HERE: list[str] | None = None


def cgroup_limits() -> list[str]:
    """Which cgroup limits kernels get on this machine: a sublist of ``["pids", "memory"]``."""
    global _LIMITS_HERE
    if _LIMITS_HERE is None:
        probe = KernelCgroups(64, 2**30)
        _LIMITS_HERE = list(probe.limits)
        probe.remove()
    return _LIMITS_HERE


def has_pids_cgroup() -> bool:
    """Can kernels get a process/thread limit on this machine?"""
    return "pids" in cgroup_limits()


def has_memory_cgroup() -> bool:
    """Can kernels get a memory limit that counts their tmpfs files too?"""
    return "memory" in cgroup_limits()


# ------------------------------------------------------------------------------ the sandbox


def _environment_roots() -> list[Path]:
    """Folders the kernel's Python needs: the interpreter's prefixes (a venv and its base)."""
    paths = [Path(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix,
                               sys.base_exec_prefix, Path(sys.executable).parent)]
    # each as it resolves, and as it is spelled (a .venv that is a link to another folder: the
    # kernel is started by the spelled path, so that path must exist inside too)
    roots = {p.resolve() for p in paths} | {Path(os.path.abspath(p)) for p in paths}
    # a folder inside another is bound with it
    return sorted(r for r in roots if not any(r != o and r.is_relative_to(o) for o in roots))


def allowlist() -> list[tuple[str, str]]:
    """``(path inside the sandbox, why)`` for everything of the host the kernel can see."""
    rows = [(p, why) for p, why in HOST_PATHS.items() if os.path.lexists(p)]
    rows += [(str(p), "the Python environment the kernel runs in (read-only)")
             for p in _environment_roots()]
    rows += [(str(ROOT / "course_utils"), "the course's library, which the notebooks import "
                                          "(read-only)"),
             ("/etc/hosts, /etc/passwd, /etc/group", "three lines each, written by the grader: "
              "localhost and the sandbox's name (torch's rendezvous looks them up), one user"),
             (CONNECTION_FILE, "the kernel's Jupyter connection file (ports and signing key of "
                               "this kernel only)"),
             ("/dev, /proc", "a minimal /dev (null, zero, random, shm) and the sandbox's own "
                             "processes"),
             ("/tmp, /home/student, /submission", "empty tmpfs the kernel may write, gone with "
                                                  "it (RAM: counted in its memory limit)"),
             ("its socket folder", "the Unix sockets the grader talks to it through, in "
                                   "/dev/shm (RAM); the grader never reads a file there")]
    return rows


def _host_binds() -> list[str]:
    args: list[str] = []
    for path in HOST_PATHS:
        if os.path.islink(path):  # merged /usr: /bin -> usr/bin
            args += ["--symlink", os.readlink(path), path]
        elif os.path.exists(path):
            args += ["--ro-bind", path, path]
    return args


def environment(hidden_cases: str | None = None, student: str | None = None) -> dict[str, str]:
    """The kernel's whole environment (see :data:`ENVIRONMENT`)."""
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "HOME": HOME,
           "LANG": "C.UTF-8", "PYTHONPATH": str(ROOT), "PYTHONDONTWRITEBYTECODE": "1",
           "TMPDIR": "/tmp", "MPLCONFIGDIR": "/tmp/matplotlib", "IPYTHONDIR": "/tmp/ipython",
           "JUPYTER_RUNTIME_DIR": "/tmp/jupyter", "JUPYTER_PLATFORM_DIRS": "1"}
    env.update({k: os.environ[k] for k in _COPIED_ENV if k in os.environ})
    if hidden_cases is not None:
        env["COURSE_HIDDEN_CASES"] = hidden_cases
    if student is not None:
        env["COURSE_STUDENT"] = student
    assert set(env) <= set(ENVIRONMENT), set(env) - set(ENVIRONMENT)
    return env


class KernelFolder:
    """The grader's folder for one kernel, under ``/dev/shm`` where it can be (RAM):
    ``etc/`` (files the kernel reads, bound read-only) and ``sockets/`` (the only folder of the
    host the kernel can write; the grader connects to sockets there and never reads a file)."""

    def __init__(self):
        base = "/dev/shm" if os.access("/dev/shm", os.W_OK | os.X_OK) else None
        self.path = Path(tempfile.mkdtemp(prefix="course-kernel-", dir=base))  # 0700
        self.etc = self.path / "etc"
        self.sockets = self.path / "sockets"
        self.etc.mkdir(mode=0o700)
        self.sockets.mkdir(mode=0o700)
        for name, text in (("hosts", f"127.0.0.1 localhost {HOSTNAME}\n::1 localhost\n"
                                     "::ffff:127.0.0.1 localhost\n"),
                           ("passwd", f"student:x:{os.getuid()}:{os.getgid()}:student:{HOME}:"
                                      "/bin/sh\n"),
                           ("group", f"student:x:{os.getgid()}:\n")):
            write_private(self.etc / name, text, mode=0o644)

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)  # (rmtree never follows a link)


def command(cmd: list[str], folder: KernelFolder, connection_file: Path, memory_gb: float,
            max_file_mb: float, cgroups: KernelCgroups | None = None,
            env: dict[str, str] | None = None) -> list[str]:
    """The kernel command ``cmd`` wrapped in bwrap (see the module doc for what it sees)."""
    # --cap-drop ALL: run as root, the kernel would keep CAP_SYS_ADMIN inside its namespaces and
    # could unmount or remount what the sandbox is made of.
    # (no --new-session: jupyter_client already starts bwrap in a session of its own, without a
    # controlling terminal, and the grader's interrupt must reach the kernel's process group)
    args = [bwrap_path() or "bwrap", "--unshare-all", "--hostname", HOSTNAME, "--cap-drop", "ALL",
            "--die-with-parent", "--clearenv"]
    for key, value in (env or environment()).items():
        args += ["--setenv", key, value]
    # the private tmpfs folders first: a bind made after them may lie inside one (a checkout or
    # its .venv under /tmp, a user called "student"); made before, the tmpfs would hide it
    args += ["--unsetenv", "JPY_PARENT_PID",  # (already gone: its parent is not in the PID ns)
             "--tmpfs", "/", "--tmpfs", "/tmp", "--tmpfs", HOME, "--tmpfs", WORKDIR,
             *_host_binds()]
    for path in [*_environment_roots(), ROOT / "course_utils"]:
        args += ["--ro-bind", str(path), str(path)]
    for name in ("hosts", "passwd", "group"):
        args += ["--ro-bind", str(folder.etc / name), f"/etc/{name}"]
    args += ["--ro-bind", str(connection_file), CONNECTION_FILE,
             "--dev", "/dev", "--proc", "/proc",
             "--bind", str(folder.sockets), str(folder.sockets),
             "--chdir", WORKDIR, "--remount-ro", "/"]
    inner = [CONNECTION_FILE if a == str(connection_file) else a for a in cmd]
    if "ipykernel_launcher" in inner:  # (no "To connect another client" banner on the grader's
        inner.append("--IPKernelApp.log_level=CRITICAL")  # terminal: its parent pid is unseen)
    args += ["prlimit", f"--as={int(memory_gb * 2**30)}",
             f"--fsize={int(max_file_mb * 2**20)}", "--core=0", "--", *inner]
    if cgroups is not None and cgroups.groups:  # join the kernel's cgroups first: all it
        join = ('for f in "$@"; do [ "$f" = -- ] && break; echo $$ > "$f" || exit 97; '
                'shift; done; shift; exec "$@"')
        args = ["sh", "-c", join, "sh", *map(str, cgroups.procs_files()), "--", *args]
    return args


def describe_limits(memory_gb: float, max_tasks: int, max_file_mb: float,
                    max_message_mb: float) -> str:
    """The limits a sandboxed kernel gets on this machine, in words."""
    parts = [f"{memory_gb:g} GiB of address space"]
    parts.append(f"{memory_gb:g} GiB of memory, files in its tmpfs included" if has_memory_cgroup()
                 else "NO memory cgroup (its tmpfs files are not counted)")
    parts.append(f"at most {max_tasks} processes and threads" if has_pids_cgroup()
                 else "NO process limit (no writable pids cgroup)")
    parts.append(f"files of at most {max_file_mb:g} MiB")
    parts.append(f"messages of at most {max_message_mb:g} MiB")
    return ", ".join(parts)


def description() -> str:
    """How grading kernels are isolated, in words for the report."""
    if not enabled():
        return (f"NOT ISOLATED ({SANDBOX_ENV}=off): submissions could read the host, solutions/ "
                "and change files; treat these grades with care")
    version = subprocess.run([bwrap_path() or "bwrap", "--version"], capture_output=True,
                             text=True).stdout.strip()
    km = SandboxedKernelManager
    limits = describe_limits(km.memory_gb.default_value, km.max_tasks.default_value,
                             km.max_file_mb.default_value, km.max_message_mb.default_value)
    return (f"sandboxed ({version}: an empty root with only the interpreter and course_utils, "
            f"a clean environment, own PID/network namespaces; {limits})")


class SandboxedKernelManager(AsyncKernelManager):
    """An ``AsyncKernelManager`` whose kernel runs in the bubblewrap sandbox.

    Without bwrap and with ``COURSE_SANDBOX=off`` it is a plain kernel manager (its sockets
    still refuse oversized messages). ``hidden_cases``: the JSON the kernel finds in
    ``COURSE_HIDDEN_CASES`` (set by ``RecoveringExecute`` before the kernel starts).
    """

    memory_gb = Float(6.0, help="memory of the kernel and its children, tmpfs files included "
                                "(GiB)", config=True)
    max_tasks = Int(1024, help="processes and threads of the kernel and its children, where "
                               "a pids cgroup is available", config=True)
    max_file_mb = Float(256.0, help="largest file the kernel may write (MiB)", config=True)
    max_message_mb = Float(32.0, help="largest message the grader accepts from the kernel "
                                      "(MiB); a larger one is dropped", config=True)

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.hidden_cases: str | None = None
        self.student: str | None = None  # COURSE_STUDENT inside (None: not set)
        self._folder: KernelFolder | None = None
        self.cgroups: KernelCgroups | None = None
        self.context.setsockopt(zmq.MAXMSGSIZE, int(self.max_message_mb * 2**20))
        if enabled():
            require()
            # Jupyter's ipc transport: Unix sockets in a folder the sandbox can reach
            self._folder = KernelFolder()
            self.transport = "ipc"
            self.ip = str(self._folder.sockets / f"k-{uuid.uuid4().hex[:8]}")
            # bwrap --die-with-parent keeps a SIGINT sent to the process group from reaching
            # the kernel: interrupt it with a control message instead (the kernel then signals
            # itself, inside the sandbox)
            if self.kernel_spec is not None:
                self.kernel_spec.interrupt_mode = "message"

    def client(self, **kwargs):
        """A client whose sockets refuse messages over ``max_message_mb`` too."""
        kc = super().client(**kwargs)
        kc.context.setsockopt(zmq.MAXMSGSIZE, int(self.max_message_mb * 2**20))
        return kc

    def oom_kills(self) -> int:
        """Processes of this kernel killed by its memory limit so far."""
        return self.cgroups.oom_kills() if self.cgroups is not None else 0

    def format_kernel_cmd(self, extra_arguments: list[str] | None = None) -> list[str]:
        cmd = super().format_kernel_cmd(extra_arguments)
        if self._folder is None:
            return cmd
        if self.cgroups is None:
            self.cgroups = KernelCgroups(self.max_tasks, int(self.memory_gb * 2**30))
        return command(cmd, self._folder, Path(self.connection_file).resolve(), self.memory_gb,
                       self.max_file_mb, self.cgroups,
                       environment(self.hidden_cases, self.student))

    async def _async_launch_kernel(self, kernel_cmd: list[str], **kw) -> None:
        # the kernel gets only ENVIRONMENT (bwrap --clearenv); sh and bwrap get the grader's
        if self._folder is not None and "env" in kw:
            kw["env"] = {k: v for k, v in kw["env"].items() if k in ("PATH", "LANG")}
        await super()._async_launch_kernel(kernel_cmd, **kw)

    async def _async_cleanup_resources(self, restart: bool = False) -> None:
        await super()._async_cleanup_resources(restart=restart)
        if not restart:
            if self._folder is not None:
                self._folder.remove()
            if self.cgroups is not None:
                self.cgroups.remove()

    cleanup_resources = _async_cleanup_resources  # (async in this class)


__all__ = ["ENVIRONMENT", "HOST_PATHS", "KernelCgroups", "SandboxUnavailable",
           "SandboxedKernelManager", "allowlist", "bwrap_path", "command", "description",
           "enabled", "environment", "has_memory_cgroup", "has_pids_cgroup", "require"]
