"""Grading kernels run in a sandbox: bubblewrap (``bwrap``), the tool Debian ships for this.

A student's answer runs as code in the grading kernel, on the instructor's own machine. The
sandbox gives that code an empty machine: nothing of the host exists inside but what the
interpreter needs (:data:`HOST_PATHS`, read-only), no environment variable but those of
:data:`ENVIRONMENT`, and no folder of the host that it can write, except the folder of its
own Jupyter sockets (below). ``SandboxedKernelManager`` starts each kernel as

    sh -c 'join the kernel's cgroups' --                  # pids, memory, cpu, freezer
    python -I grading/relay.py ... --                     # the grader's side of its sockets
    bwrap --unshare-... --cap-drop ALL --die-with-parent  # own PID/network/IPC/UTS(/user) ns
          --clearenv --setenv <ENVIRONMENT> ...           # nothing of the grader's environment
          --tmpfs /  ... --remount-ro /                   # an empty, read-only root
          --ro-bind <HOST_PATHS> ...                      # /usr, the loader's cache, fonts
          --ro-bind <interpreter prefixes> --ro-bind <repository>/course_utils
          --ro-bind <grader's etc/> /etc/{hosts,passwd,group}
          --ro-bind <connection file> /run/jupyter/kernel.json
          --tmpfs /tmp --tmpfs /home/student --tmpfs /submission   # RAM, counted in its memory
          --bind <its socket folder> ...                  # Jupyter's ipc sockets
          --chdir /submission
          setpriv --reuid <its own uid> ...               # (a root grader's kernel: not root)
          prlimit --as --fsize --core python -m ipykernel_launcher -f /run/jupyter/kernel.json

What the kernel sees, and why, is :func:`allowlist` (the instructor's guide prints it); not the
instructor's home, other checkouts, the collect inbox, ``$COURSE_DATA``, this repository apart
from ``course_utils``, the grader's environment, nor its own notebook (nbclient sends cells as
messages). It writes ``/tmp``, ``/home/student`` and ``/submission`` (tmpfs gone with it; the
grader never reads them) and its socket folder (:class:`KernelFolder`; only its relay connects,
by descriptor). It is never host root (:func:`_namespaces`) and holds no file of the host open
(the relay gives it /dev/null and a pipe).

Limits (each named in the report when it fires, :func:`describe_limits`):

* **Memory**: ``RLIMIT_AS`` (``memory_gb``): an allocation beyond it is a ``MemoryError`` in its
  cell. Where the machine has a writable memory cgroup (cgroup v1 ``memory`` or a delegated v2
  tree), the kernel and everything it starts, *files in its tmpfs and /dev/shm included*, are
  capped at the same size; past it the kernel is killed and restarted, and the cell says that
  the memory limit stopped it.
* **Files**: ``RLIMIT_FSIZE`` (``max_file_mb``; ``EFBIG``); the total is bounded by memory.
* **Processes and threads**: a ``pids`` cgroup (``max_tasks``; ``RLIMIT_NPROC`` never binds root).
* **CPU**: the kernel and everything it starts are one entity of the CPU scheduler (a ``cpu``
  cgroup; ``max_cpus`` caps it too), and after each cell the processes it left running are
  ended (:meth:`SandboxedKernelManager.end_strays`; ``grading/cgroups.py``).
* **Messages**: the kernel's relay (:mod:`grading.relay`, in the kernel's cgroups) forwards
  no message over ``max_message_mb`` in all its frames or ``max_message_items`` items, one
  reply per request and output within ``max_cell_messages_mb`` / ``max_notebook_messages_mb``;
  the grader's own sockets refuse a frame over the size too and queue two messages
  (:func:`grading.relay.bound_sockets`, :func:`grading.relay.guarded_unpack`);
  ``grading.preprocessors.RecoveringExecute`` caps what it keeps per cell and per notebook.

Without ``bwrap`` (macOS, a Linux without the package) :func:`require` refuses to grade unless
the instructor allows it (``COURSE_SANDBOX=off``); the report then says grading was not isolated.
"""

from __future__ import annotations

import json
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

from course_utils.assess.checks import SUBMIT_MIME
from grading import cgroups, relay
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
                      "numbers): course_utils.assess.variants draws that student's givens from it, "
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


SETPRIV = "/usr/bin/setpriv"  # (util-linux) drops a root grader's kernel to its own uid


def require() -> None:
    """Raise :class:`SandboxUnavailable` unless kernels can be sandboxed or isolation is off."""
    if enabled() and os.geteuid() == 0 and not os.access(SETPRIV, os.X_OK):
        raise SandboxUnavailable(
            f"grading runs as root, and its kernels must not: {SETPRIV} (util-linux) drops "
            f"each to a uid of its own, and it is not installed. Install util-linux, or grade "
            f"as an ordinary user.")
    if enabled() and os.geteuid() == 0:
        unreadable = [str(p) for p in [*_environment_roots(), ROOT / "course_utils",
                                       Path(sys.executable).resolve()]
                      if not os.stat(p).st_mode & 0o004]
        if unreadable:
            raise SandboxUnavailable(
                f"grading kernels run as a uid of their own, which must read the Python "
                f"environment and course_utils: {', '.join(unreadable)} cannot be read by "
                f"others (a umask of 077?). Run chmod -R o+rX on them.")
    if enabled() and bwrap_path() is None:
        raise SandboxUnavailable(
            "grading kernels run in a bubblewrap sandbox, but `bwrap` is not installed "
            "(Debian/Ubuntu: apt-get install bubblewrap). To grade WITHOUT isolation anyway "
            f"(a submission can then read solutions/ and change other results), set "
            f"{SANDBOX_ENV}=off; the report will say that grading was not isolated.")


# ------------------------------------------------------------------------------ cgroups


def has_pids_cgroup() -> bool:
    """Can kernels get a process/thread limit on this machine?"""
    return "pids" in cgroups.limits_here()


def has_memory_cgroup() -> bool:
    """Can kernels get a memory limit that counts their tmpfs files too?"""
    return "memory" in cgroups.limits_here()


def has_cpu_cgroup() -> bool:
    """Is each kernel, with everything it starts, one scheduling entity on this machine?"""
    return "cpu" in cgroups.limits_here()


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


def _host_binds(made: set[str]) -> list[str]:
    args: list[str] = []
    for path in HOST_PATHS:
        if os.path.islink(path):  # merged /usr: /bin -> usr/bin
            args += ["--symlink", os.readlink(path), path]
        elif os.path.exists(path):
            args += [*_way_to(Path(path), made), "--ro-bind", path, path]
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
    ``etc/`` (files the kernel reads, bound read-only), ``relay/`` (the sockets the grader
    connects to, served by the kernel's relay, :mod:`grading.relay`; never inside the sandbox)
    and ``sockets/`` (the only folder of the host the kernel can write: its own sockets, which
    only the relay connects to, by file descriptor).

    Where the grader runs as root, the kernel runs as ``uid``, an unprivileged uid of its own
    (``KERNEL_UIDS``: no file of the host belongs to it), and ``sockets/`` is a tmpfs of its own
    with ``SOCKET_FS_KIB`` of bytes and ``SOCKET_FS_INODES`` files (the kernel's five sockets
    need five), owned by that uid: a kernel that fills it fills only it, never the machine's
    ``/dev/shm`` that every other kernel's folder lives in. :meth:`remove` unmounts it
    (whatever is inside goes with it, however deep) and removes the rest with ``rm -rf`` in a
    subprocess (no recursion limit, no link followed). The folder is named after the grading
    process, so a folder whose grader was killed is removed by the next kernel
    (:func:`sweep_orphan_folders`)."""

    SOCKET_FS_KIB = 256
    SOCKET_FS_INODES = 64
    KERNEL_UIDS = (2_100_000_000, 2**24)  # (first, how many): one drawn per kernel

    def __init__(self):
        import secrets

        base = "/dev/shm" if os.access("/dev/shm", os.W_OK | os.X_OK) else None
        sweep_orphan_folders(Path(base or tempfile.gettempdir()))
        self.path = Path(tempfile.mkdtemp(prefix=f"{cgroups.CGROUP_PREFIX}{os.getpid()}-",
                                          dir=base))  # 0700
        if os.geteuid() == 0:
            self.uid = self.gid = self.KERNEL_UIDS[0] + secrets.randbelow(self.KERNEL_UIDS[1])
        else:
            self.uid, self.gid = os.getuid(), os.getgid()
        self.etc, self.relay = self.path / "etc", self.path / "relay"
        self.sockets = self.path / "sockets"
        for folder in (self.etc, self.relay, self.sockets):
            folder.mkdir(mode=0o700)
        self.own_fs = _mount_tmpfs(self.sockets, self.SOCKET_FS_KIB, self.SOCKET_FS_INODES,
                                   self.uid, self.gid)
        for name, text in (("hosts", f"127.0.0.1 localhost {HOSTNAME}\n::1 localhost\n"
                                     "::ffff:127.0.0.1 localhost\n"),
                           ("passwd", f"student:x:{self.uid}:{self.gid}:student:{HOME}:"
                                      "/bin/sh\n"),
                           ("group", f"student:x:{self.gid}:\n")):
            write_private(self.etc / name, text, mode=0o644)

    def remove(self) -> None:
        """Remove the folder and all a kernel left in it (see the class doc)."""
        _remove_tree(self.path, self.sockets if self.own_fs else None)


def _mount_tmpfs(path: Path, kib: int, inodes: int, uid: int, gid: int) -> bool:
    """Mount a tmpfs of ``kib`` KiB and ``inodes`` files owned by ``uid`` on ``path`` (root
    only); mounted?"""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        return False
    done = subprocess.run(["mount", "-t", "tmpfs", "-o",
                           f"size={int(kib)}k,nr_inodes={int(inodes)},mode=0700,uid={uid},"
                           f"gid={gid},nosuid,nodev,noexec", "tmpfs", str(path)],
                          capture_output=True, timeout=30)
    return done.returncode == 0


def _remove_tree(path: Path, mount: Path | None = None) -> None:
    """Remove ``path`` whatever it holds: ``mount`` unmounted first (lazily: the tree goes when
    the last process holding it ends), then owner permissions restored (a folder of mode 000)
    and ``rm -rf`` (neither follows a link; neither recurses in Python)."""
    if mount is not None:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True, timeout=30)
    for cmd in (["chmod", "-R", "u+rwX", "--", str(path)],
                ["rm", "-rf", "--one-file-system", "--", str(path)]):
        try:
            subprocess.run(cmd, capture_output=True, timeout=120)
        except (OSError, subprocess.SubprocessError):
            pass


def _mounted(path: Path) -> bool:
    try:
        return any(line.split()[1] == str(path) for line in
                   Path("/proc/self/mounts").read_text().splitlines() if len(line.split()) > 1)
    except OSError:
        return False


def sweep_orphan_folders(base: Path) -> list[Path]:
    """Remove the kernel folders in ``base`` whose grading process has ended (a worker or a
    Slurm task killed at its time limit could not remove its own); the removed paths."""
    removed = []
    try:
        folders = [f for f in base.iterdir() if f.name.startswith(cgroups.CGROUP_PREFIX)]
    except OSError:
        return removed
    for folder in folders:
        try:
            alive = cgroups.creator_alive(folder.name)
            if alive or (alive is None and time.time() - folder.lstat().st_mtime <
                         cgroups.LEGACY_CGROUP_AGE_S) or not folder.is_dir() or folder.is_symlink():
                continue
        except OSError:
            continue
        sockets = folder / "sockets"
        _remove_tree(folder, sockets if _mounted(sockets) else None)
        removed.append(folder)
    return removed


def command(cmd: list[str], folder: KernelFolder, connection_file: Path, memory_gb: float,
            max_file_mb: float, groups: cgroups.KernelCgroups | None = None,
            env: dict[str, str] | None = None) -> list[str]:
    """The kernel command ``cmd`` wrapped in bwrap (see the module doc for what it sees)."""
    # --cap-drop ALL: run as root, the kernel would keep CAP_SYS_ADMIN inside its namespaces and
    # could unmount or remount what the sandbox is made of.
    # (no --new-session: jupyter_client already starts bwrap in a session of its own, without a
    # controlling terminal, and the grader's interrupt must reach the kernel's process group)
    args = [bwrap_path() or "bwrap", *_namespaces(), "--hostname", HOSTNAME,
            "--die-with-parent", "--clearenv"]
    for key, value in (env or environment()).items():
        args += ["--setenv", key, value]
    # private tmpfs /tmp, HOME and WORKDIR (mode 1777: the kernel's own uid writes them), made
    # before any bind (a checkout or its .venv under /tmp, a user called "student")
    args += ["--unsetenv", "JPY_PARENT_PID",  # (already gone: its parent is not in the PID ns)
             *host_view([ROOT / "course_utils"], [folder.sockets],
                        [*((folder.etc / n, f"/etc/{n}") for n in ("hosts", "passwd", "group")),
                         (connection_file, CONNECTION_FILE)], ("/tmp", HOME, WORKDIR)),
             "--chdir", WORKDIR]
    inner = [CONNECTION_FILE if a == str(connection_file) else a for a in cmd]
    if "ipykernel_launcher" in inner:  # (no "To connect another client" banner on the grader's
        inner.append("--IPKernelApp.log_level=CRITICAL")  # terminal: its parent pid is unseen)
    if os.geteuid() == 0:  # the kernel's own unprivileged uid, no capability, no way back
        args += [SETPRIV, f"--reuid={folder.uid}", f"--regid={folder.gid}", "--clear-groups",
                 "--inh-caps=-all", "--no-new-privs", "--"]
    args += ["prlimit", f"--as={int(memory_gb * 2**30)}",
             f"--fsize={int(max_file_mb * 2**20)}", "--core=0", "--", *inner]
    return _join_cgroups(args, groups)


def host_view(read_only: list[Path], writable: list[Path], files: list[tuple[Path, str]] = (),
              private: tuple[str, ...] = ("/tmp",)) -> list[str]:
    """bwrap options: an empty read-only root, ``private`` tmpfs, :data:`HOST_PATHS`, the Python
    environment, ``read_only``, ``files`` (host, inside), /dev, /proc, ``writable`` binds last."""
    args = ["--tmpfs", "/"]
    for path in private:  # (first: made after a bind inside one, the tmpfs would hide it)
        args += ["--perms", "01777", "--tmpfs", path]
    made: set[str] = set()
    args += _host_binds(made)
    for path in [*_environment_roots(), *map(Path, read_only)]:
        args += [*_way_to(path, made), "--ro-bind", str(path), str(path)]
    for src, inside in files:
        args += [*_way_to(Path(inside), made), "--ro-bind", str(src), inside]
    # /dev before the writable binds (one may be in /dev/shm); /proc/sys read-only, whoever runs
    args += ["--dev", "/dev", "--proc", "/proc", "--ro-bind", "/proc/sys", "/proc/sys",
             "--ro-bind-try", "/proc/sysrq-trigger", "/proc/sysrq-trigger"]
    for path in map(Path, writable):
        args += [*_way_to(path, made), "--bind", str(path), str(path)]
    return [*args, "--remount-ro", "/"]


def _way_to(path: Path, made: set[str]) -> list[str]:
    """bwrap options that make the folders on the way to ``path`` (not ``path`` itself) as
    mode 0755, so the kernel's own uid can pass (bwrap makes them 0700, as root's own); a
    folder bound whole, a private tmpfs, ``/dev`` and those in ``made`` are left as they are."""
    whole = [h for h in HOST_PATHS if os.path.isdir(h) and not os.path.islink(h)]
    kept = {"/", "/dev", "/tmp", HOME, WORKDIR}
    args = []
    for parent in reversed(Path(path).parents):
        where = str(parent)
        if where in kept or where in made or any(where == h or where.startswith(h + "/")
                                                 for h in whole):
            continue
        made.add(where)
        args += ["--perms", "0755", "--dir", where]
    return args


def _namespaces() -> list[str]:
    """bwrap's namespace and capability options. As root, bwrap's user namespace would map the
    kernel to host uid 0 (``0 0 1``), and /proc/sys checks the uid, not capabilities: so no
    user namespace, and the kernel drops to its own uid with ``setpriv`` (bwrap keeps only the
    two capabilities that needs; setuid clears them). Not root: bwrap's user namespace maps the
    kernel to the grader's own unprivileged uid."""
    if os.geteuid() != 0:
        return ["--unshare-all", "--cap-drop", "ALL"]
    return ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts",
            "--unshare-cgroup-try", "--cap-drop", "ALL", "--cap-add", "CAP_SETUID",
            "--cap-add", "CAP_SETGID"]


def _join_cgroups(args: list[str], groups: cgroups.KernelCgroups | None) -> list[str]:
    """``args`` run after joining the kernel's cgroups (all it starts is in them too)."""
    if groups is None or not groups.groups:
        return args
    join = ('for f in "$@"; do [ "$f" = -- ] && break; echo $$ > "$f" || exit 97; '
            'shift; done; shift; exec "$@"')
    return ["sh", "-c", join, "sh", *map(str, groups.procs_files()), "--", *args]


def describe_limits(memory_gb: float, max_tasks: int, max_file_mb: float,
                    max_message_mb: float) -> str:
    """The limits a sandboxed kernel gets on this machine, in words."""
    parts = [f"{memory_gb:g} GiB of address space"]
    parts.append(f"{memory_gb:g} GiB of memory, files in its tmpfs included" if has_memory_cgroup()
                 else "NO memory cgroup (its tmpfs files are not counted)")
    parts.append(f"at most {max_tasks} processes and threads" if has_pids_cgroup()
                 else "NO process limit (no writable pids cgroup)")
    parts.append("one CPU share for all its processes, those a cell leaves running ended"
                 if has_cpu_cgroup() else "NO CPU share (no writable cpu cgroup)")
    parts.append(f"a socket folder of {KernelFolder.SOCKET_FS_INODES} files"
                 if os.geteuid() == 0 else "NO file budget for its socket folder (not root)")
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
    max_message_items = Int(1_000_000, help="items (list or object entries) in one message "
                                            "from the kernel; a message with more is refused "
                                            "before it is parsed", config=True)
    max_cpus = Float(0.0, help="cores the kernel and its children may use at most (0: no cap; "
                               "they always share the CPU as one entity)", config=True)
    max_cell_messages_mb = Float(8.0, help="output messages the relay passes to the grader "
                                           "per cell (MB, as sent); the rest is dropped "
                                           "before the grader reads it", config=True)
    max_notebook_messages_mb = Float(48.0, help="output messages the relay passes to the "
                                                "grader per kernel, test submissions aside "
                                                "(MB, as sent)", config=True)

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.hidden_cases: str | None = None
        self.student: str | None = None  # COURSE_STUDENT inside (None: not set)
        self._folder: KernelFolder | None = None
        self.cgroups: cgroups.KernelCgroups | None = None
        relay.bound_sockets(self.context, self.max_message_mb)
        self.session.unpack = relay.guarded_unpack(self.session.unpack, self.max_message_items)
        if enabled():
            require()
            # Jupyter's ipc transport: Unix sockets of the kernel's relay, in a folder of the
            # grader's that the sandbox does not see
            self._folder = KernelFolder()
            self.transport = "ipc"
            self.ip = str(self._folder.relay / f"g-{uuid.uuid4().hex[:8]}")
            # bwrap --die-with-parent keeps a SIGINT sent to the process group from reaching
            # the kernel: interrupt it with a control message instead (the kernel then signals
            # itself, inside the sandbox)
            if self.kernel_spec is not None:
                self.kernel_spec.interrupt_mode = "message"

    def client(self, **kwargs):
        """A client whose sockets refuse messages over ``max_message_mb`` too."""
        kc = super().client(**kwargs)
        relay.bound_sockets(kc.context, self.max_message_mb)
        return kc

    def oom_kills(self) -> int:
        """Processes of this kernel killed by its memory limit so far."""
        return self.cgroups.oom_kills() if self.cgroups is not None else 0

    def format_kernel_cmd(self, extra_arguments: list[str] | None = None) -> list[str]:
        cmd = super().format_kernel_cmd(extra_arguments)
        if self._folder is None:
            return cmd
        if self.cgroups is None:
            self.cgroups = cgroups.KernelCgroups(self.max_tasks, int(self.memory_gb * 2**30),
                                                 self.max_cpus)
        folder = self._folder
        kernel_file = folder.etc / "kernel.json"  # (written by the relay: the kernel's sockets)
        cmd = [str(kernel_file) if a == self.connection_file else a for a in cmd]
        sandboxed = command(cmd, folder, kernel_file, self.memory_gb, self.max_file_mb, None,
                            environment(self.hidden_cases, self.student))
        limits = {"max_bytes": int(self.max_message_mb * 2**20),
                  "max_items": self.max_message_items,
                  "cell_bytes": int(self.max_cell_messages_mb * 1e6),
                  "notebook_bytes": int(self.max_notebook_messages_mb * 1e6),
                  "submit_mime": SUBMIT_MIME, "kernel_sockets": str(folder.sockets),
                  "memory_bytes": 0 if has_memory_cgroup() else int(self.memory_gb * 2**30),
                  "start_s": 120}
        write_private(folder.etc / "relay.json", json.dumps(limits), mode=0o600)
        relayed = [sys.executable, "-I", relay.__file__, str(Path(self.connection_file).resolve()),
                   str(kernel_file), str(folder.etc / "relay.json"), "--"]
        return _join_cgroups(relayed + sandboxed, self.cgroups)

    async def _async_launch_kernel(self, kernel_cmd: list[str], **kw) -> None:
        # the kernel gets only ENVIRONMENT (bwrap --clearenv); sh, the relay and bwrap get the
        # grader's PATH and LANG. No file of the grader's is the kernel's stdin or stdout (the
        # relay gives the sandbox /dev/null and a pipe of its own for stderr; the relay's own
        # stderr, its few lines, is the grader's log)
        if self._folder is not None:
            kw["env"] = {k: v for k, v in kw.get("env", os.environ).items()
                         if k in ("PATH", "LANG")}
            kw["stdin"] = kw["stdout"] = subprocess.DEVNULL
        await super()._async_launch_kernel(kernel_cmd, **kw)

    def record_kernel(self) -> None:
        """Remember the sandbox's own processes; call once the kernel is ready, before any
        student code runs (and again after a restart)."""
        process = getattr(getattr(self, "provisioner", None), "process", None)
        if self.cgroups is not None and process is not None:
            self.cgroups.record_kernel(process.pid)

    def end_strays(self) -> int:
        """End the processes the last cell left running (detached or not), except the kernel
        and the course's rank launcher; how many were ended."""
        return self.cgroups.end_strays() if self.cgroups is not None else 0

    async def _async_cleanup_resources(self, restart: bool = False) -> None:
        """Jupyter's clean-up, then the kernel's cgroups, then its folder: each step runs
        whatever the one before it raised, and none stops the grading of the next student."""
        steps = []
        try:
            await super()._async_cleanup_resources(restart=restart)
        except Exception as err:  # noqa: BLE001
            self.log.warning("cleaning up the kernel: %s: %s", type(err).__name__, err)
        if restart:
            return
        if self.cgroups is not None:
            steps += [self.cgroups.end_strays, self.cgroups.remove]
        if self._folder is not None:
            steps.append(self._folder.remove)
        for step in steps:
            try:
                step()
            except Exception as err:  # noqa: BLE001 - RecursionError, a busy mount, ...
                self.log.warning("cleaning up the kernel: %s: %s", type(err).__name__, err)

    cleanup_resources = _async_cleanup_resources  # (async in this class)


__all__ = ["ENVIRONMENT", "HOST_PATHS", "KernelFolder", "SandboxUnavailable",
           "SandboxedKernelManager", "allowlist", "bwrap_path", "command", "description",
           "enabled", "environment", "has_cpu_cgroup", "has_memory_cgroup", "has_pids_cgroup",
           "host_view", "require", "sweep_orphan_folders"]
