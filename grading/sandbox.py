"""Grading kernels run in a sandbox: bubblewrap (``bwrap``), the tool Debian ships for this.

A student's answer runs as code in the grading kernel. Outside a sandbox it could read the
reference solutions, rewrite the course library or the reference data, edit other students'
results or the gradebook, or leave a process behind that changes things after grading. Here each
kernel (``SandboxedKernelManager``, used by ``grading.preprocessors.RecoveringExecute``) starts as

    bwrap --unshare-all --cap-drop ALL                   # own PID, network, IPC namespaces,
          --die-with-parent                                #   no capabilities
          --ro-bind / /                                    # the system, read-only
          --tmpfs <repository> --ro-bind <repository>/course_utils ... # only the library and
          --ro-bind <environment> ...                      #   the Python environment come back
          --tmpfs <course data>                            # no gradebook, reference, peers
          --bind <this submission's folder> ...            # its own folder, read-write
          prlimit --as=<memory> python -m ipykernel_launcher -f <connection file>

* **Files.** The kernel sees the system and the Python environment read-only, the course's
  ``course_utils`` read-only, its own autograded folder read-write, and a private ``/tmp``. It
  does not see ``solutions/``, ``authoring/``, ``grading/``, the reference cache, the gradebook or
  any other student (they are not there: a ``tmpfs`` covers them).
* **Processes.** Its own PID namespace: when the kernel ends, every process it started ends too
  (a detached ``start_new_session`` child included).
* **Network.** Its own network namespace with only a loopback of its own (the course's ranks
  still rendezvous on 127.0.0.1 inside it). The kernel talks to the grader over Unix sockets
  (Jupyter's ``ipc`` transport) in a folder bound into the sandbox.
* **Memory.** ``RLIMIT_AS`` (``Sandbox.memory_gb``): an answer that allocates more gets a
  ``MemoryError`` in its own cell.
* **Processes and threads.** Where the machine has a writable ``pids`` cgroup (cgroup v1's
  ``/sys/fs/cgroup/pids``, or a delegated v2 tree), each kernel gets its own with ``pids.max``
  (``Sandbox.max_tasks``): a fork or thread bomb fails inside its own cell. ``RLIMIT_NPROC``
  would not do: it never binds root. :func:`description` says whether this limit applies.

Where ``bwrap`` is missing (macOS, or a Linux without the package) :func:`require` refuses to
grade unless the instructor allows unisolated grading explicitly (``COURSE_SANDBOX=off``); the
report then says that grading was not isolated.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import uuid
from pathlib import Path

from jupyter_client.manager import AsyncKernelManager
from traitlets import Float, Int

ROOT = Path(__file__).resolve().parent.parent
SANDBOX_ENV = "COURSE_SANDBOX"  # "on" (default): bwrap required; "off": grade without isolation


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


def pids_cgroup(max_tasks: int) -> Path | None:
    """A new cgroup that allows at most ``max_tasks`` processes and threads, or None where the
    machine has no writable ``pids`` controller."""
    for base in (Path("/sys/fs/cgroup/pids"), Path("/sys/fs/cgroup")):
        group = base / f"course-kernel-{uuid.uuid4().hex[:12]}"
        try:
            group.mkdir()
        except OSError:
            continue
        try:
            (group / "pids.max").write_text(str(int(max_tasks)))
            return group
        except OSError:
            remove_cgroup(group)
    return None


def remove_cgroup(group: Path | None) -> None:
    """Remove a cgroup made by :func:`pids_cgroup` (once its processes have ended)."""
    if group is not None:
        try:
            group.rmdir()
        except OSError:
            pass


_HAS_PIDS_CGROUP: bool | None = None


def has_pids_cgroup() -> bool:
    """Can kernels get a process/thread limit on this machine?"""
    global _HAS_PIDS_CGROUP
    if _HAS_PIDS_CGROUP is None:
        group = pids_cgroup(1)
        _HAS_PIDS_CGROUP = group is not None
        remove_cgroup(group)
    return _HAS_PIDS_CGROUP


def description() -> str:
    """How grading kernels are isolated, in words for the report."""
    if not enabled():
        return (f"NOT ISOLATED ({SANDBOX_ENV}=off): submissions could read solutions/ and "
                "change files; treat these grades with care")
    import subprocess

    version = subprocess.run([bwrap_path() or "bwrap", "--version"], capture_output=True,
                             text=True).stdout.strip()
    tasks = (f"at most {SandboxedKernelManager.max_tasks.default_value} processes and threads"
             if has_pids_cgroup() else "NO process limit (no writable pids cgroup)")
    return (f"sandboxed ({version}: own PID/network namespaces, repository and data hidden, "
            f"{SandboxedKernelManager.memory_gb.default_value:g} GiB of memory, {tasks})")


def _data_dir() -> Path:
    return Path(os.environ.get("COURSE_DATA", ROOT / ".course_data")).expanduser().resolve()


def _environment_roots() -> list[Path]:
    """Folders the kernel's Python needs: the interpreter's prefixes (a venv and its base)."""
    roots = []
    for p in {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}:
        roots.append(Path(p).resolve())
    exe = Path(sys.executable)
    roots.append(exe.parent.resolve())
    return sorted(set(roots))


def command(cmd: list[str], workdir: Path, sockets: Path, connection_file: Path,
            memory_gb: float, cgroup: Path | None = None) -> list[str]:
    """The kernel command ``cmd`` wrapped in bwrap (see the module doc for what it sees)."""
    root, data = ROOT.resolve(), _data_dir()
    # --cap-drop ALL: run as root, the kernel would keep CAP_SYS_ADMIN inside its namespaces and
    # could simply unmount the tmpfs that hides the repository
    # (no --new-session: jupyter_client already starts bwrap in a session of its own, without a
    # controlling terminal, and the grader's interrupt must reach the kernel's process group)
    args = [bwrap_path() or "bwrap", "--unshare-all", "--cap-drop", "ALL", "--die-with-parent",
            "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp"]
    hidden = [root, data]
    cache = os.environ.get("COURSE_REFERENCE_CACHE")  # the judge's expected values
    if cache and not any(Path(cache).resolve().is_relative_to(h) for h in hidden):
        hidden.append(Path(cache).resolve())
    for folder in hidden:
        args += ["--tmpfs", str(folder)]
    # bring back what the kernel needs, read-only (the environment may live under a hidden
    # folder, such as the repository's .venv or a clone in /tmp)
    for path in [root / "course_utils", *_environment_roots()]:
        if path.exists():
            args += ["--ro-bind", str(path), str(path)]
    # Inside the empty network namespace, torch's TCPStore names its peers through /etc/hosts
    # (an IPv4-mapped loopback address too: without it every rendezvous warns on stderr).
    hosts = sockets / "hosts"
    hosts.write_text("127.0.0.1 localhost\n::1 localhost\n::ffff:127.0.0.1 localhost\n")
    args += ["--bind", str(workdir), str(workdir),
             "--bind", str(sockets), str(sockets),
             "--ro-bind", str(hosts), "/etc/hosts",
             "--ro-bind", str(connection_file), str(connection_file),
             "--unsetenv", "JPY_PARENT_PID",  # its parent is not in the PID namespace
             # the home folder is read-only: caches go to the private /tmp
             "--setenv", "MPLCONFIGDIR", "/tmp/matplotlib", "--setenv", "IPYTHONDIR", "/tmp/ipython",
             "--chdir", str(workdir)]
    limit = int(memory_gb * 2**30)
    args += ["prlimit", f"--as={limit}", "--"] + cmd
    if cgroup is not None:  # join the kernel's pids cgroup first: all it starts stays inside
        args = ["sh", "-c", 'echo $$ > "$0" && exec "$@"', str(cgroup / "cgroup.procs"), *args]
    return args


class SandboxedKernelManager(AsyncKernelManager):
    """An ``AsyncKernelManager`` whose kernel runs in the bubblewrap sandbox.

    The kernel's working folder (nbclient's ``cwd``: the submission's autograded folder) is the
    only course folder it can write. Without bwrap and with ``COURSE_SANDBOX=off`` it is a
    plain kernel manager.
    """

    memory_gb = Float(6.0, help="address-space limit of the kernel and its children (GiB)",
                      config=True)
    max_tasks = Int(1024, help="processes and threads of the kernel and its children, where "
                               "a pids cgroup is available", config=True)

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._sockets: Path | None = None
        self._cgroup: Path | None = None
        if enabled():
            require()
            # Jupyter's ipc transport: Unix sockets in a folder the sandbox can reach
            self._sockets = Path(tempfile.mkdtemp(prefix="course-kernel-"))
            self.transport = "ipc"
            self.ip = str(self._sockets / f"k-{uuid.uuid4().hex[:8]}")
            # bwrap --die-with-parent keeps a SIGINT sent to the process group from reaching
            # the kernel: interrupt it with a control message instead (the kernel then signals
            # itself, inside the sandbox)
            if self.kernel_spec is not None:
                self.kernel_spec.interrupt_mode = "message"

    def format_kernel_cmd(self, extra_arguments: list[str] | None = None) -> list[str]:
        cmd = super().format_kernel_cmd(extra_arguments)
        if self._sockets is None:
            return cmd
        workdir = Path(self._launch_args.get("cwd") or os.getcwd()).resolve()
        if self._cgroup is None:
            self._cgroup = pids_cgroup(self.max_tasks)
        return command(cmd, workdir, self._sockets, Path(self.connection_file).resolve(),
                       self.memory_gb, self._cgroup)

    async def cleanup_resources(self, restart: bool = False) -> None:  # (async in this class)
        await super().cleanup_resources(restart=restart)
        if self._sockets is not None and not restart:
            shutil.rmtree(self._sockets, ignore_errors=True)
            remove_cgroup(self._cgroup)
