"""A grading kernel's own cgroups: its processes, memory and CPU, and ending what it leaves.

Each sandboxed kernel (``grading.sandbox``) joins a group of its own in every controller the
machine lets the grader write (cgroup v1 under ``/sys/fs/cgroup/<controller>``, or one v2 group
with the controllers delegated); whatever it starts, detached or not, is in the same groups:

* ``pids``: at most ``max_tasks`` processes and threads (``RLIMIT_NPROC`` would not do: it
  never binds root);
* ``memory``: at most ``memory_bytes``, anonymous memory, page cache and tmpfs files alike,
  no swap;
* ``cpu``: the kernel and everything it starts are **one** scheduling entity with the default
  weight (v1 ``cpu.shares`` 1024, v2 ``cpu.weight`` 100), so 700 busy processes of one
  submission get the CPU that one honest kernel gets beside them, not 700 times it; and, if
  ``max_cpus`` is set, a hard cap of that many cores (``cpu.cfs_quota_us`` / ``cpu.max``);
* ``freezer``: the group can be stopped whole while :meth:`KernelCgroups.end_strays` ends
  the processes a cell left behind (no fork can race the kill).

Every group is named ``course-kernel-<pid of the grading process>-<id>``: a grading process
killed at its time limit cannot remove its groups, and the next kernel started on the machine
removes every empty group whose creator has ended (:func:`sweep_orphans`).
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from pathlib import Path

CGROUP_PREFIX = "course-kernel-"
V1 = Path("/sys/fs/cgroup")
CONTROLLERS = ("pids", "memory", "cpu", "freezer")
CGROUP_ROOTS = (V1, *(V1 / c for c in CONTROLLERS))
LEGACY_CGROUP_AGE_S = 900  # a group named without its creator's pid (older course versions)
PID_MAX = 2**22  # Linux's largest pid_max: a larger "pid" in a name is no pid (os.kill overflows)
# Processes of the course's own that outlive a cell by design: the rank launcher's forkserver
# (course_utils.launch: preloaded torch, 1-6 s to start) and multiprocessing's resource tracker,
# each a direct child of the kernel. (A student's process that imitates one only keeps its own
# CPU, which the cpu group already shares fairly.)
KEPT_CHILDREN = ("from multiprocessing.forkserver import main",
                 "from multiprocessing.resource_tracker import main")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        pass
    return True


def creator_alive(name: str) -> bool | None:
    """Is the grading process named in ``course-kernel-<pid>-...`` alive (None: no pid in it)?"""
    creator, _, _ = name[len(CGROUP_PREFIX):].partition("-")
    if creator.isdigit() and int(creator) <= PID_MAX:
        return _alive(int(creator))
    return None


def sweep_orphans(roots: tuple[Path, ...] = CGROUP_ROOTS) -> list[Path]:
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
            try:
                alive = creator_alive(group.name)
                if alive or (alive is None and
                             time.time() - group.stat().st_mtime < LEGACY_CGROUP_AGE_S):
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


def _write(path: Path, value: object) -> bool:
    try:
        path.write_text(str(value))
        return True
    except OSError:
        return False


def _stat(pid: int) -> tuple[str, int] | None:
    """``(state, parent pid)`` of a process (``/proc/<pid>/stat``), or None if it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return fields[0], int(fields[1])
    except (OSError, ValueError, IndexError):
        return None


def _ppid(pid: int) -> int | None:
    stat = _stat(pid)
    return None if stat is None else stat[1]


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()[:4096].replace(b"\0", b" ").decode(
            "utf-8", "replace")
    except OSError:
        return ""


class KernelCgroups:
    """The kernel's own cgroups (see the module doc); :attr:`limits` names those that apply,
    a sublist of ``["pids", "memory", "cpu", "freezer"]``."""

    def __init__(self, max_tasks: int, memory_bytes: int, max_cpus: float = 0.0):
        self.groups: list[Path] = []
        self.limits: list[str] = []
        self._by: dict[str, Path] = {}
        self._v2 = False
        self.kernel_pids: set[int] = set()
        self.kernel_pid: int | None = None
        sweep_orphans()
        name = f"{CGROUP_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:8]}"
        if (V1 / "cgroup.controllers").exists():
            self._init_v2(name, max_tasks, memory_bytes, max_cpus)
            return
        for controller in CONTROLLERS:
            group = self._make(V1 / controller / name)
            if group is None:
                continue
            if self._setup_v1(controller, group, max_tasks, memory_bytes, max_cpus):
                self._by[controller] = group
                self.limits.append(controller)
            else:
                self.groups.remove(group)
                _rmdir(group)

    @staticmethod
    def _setup_v1(controller: str, group: Path, max_tasks: int, memory_bytes: int,
                  max_cpus: float) -> bool:
        if controller == "pids":
            return _write(group / "pids.max", int(max_tasks))
        if controller == "memory":
            if not _write(group / "memory.limit_in_bytes", int(memory_bytes)):
                return False
            _write(group / "memory.memsw.limit_in_bytes", int(memory_bytes))  # no swap beyond
            return True
        if controller == "cpu":
            if not _write(group / "cpu.shares", 1024):
                return False
            if max_cpus > 0:
                try:
                    period = int((group / "cpu.cfs_period_us").read_text())
                except (OSError, ValueError):
                    return False
                return _write(group / "cpu.cfs_quota_us", int(max_cpus * period))
            return True
        return (group / "freezer.state").exists()

    def _init_v2(self, name: str, max_tasks: int, memory_bytes: int, max_cpus: float) -> None:
        root = V1
        controllers = set((root / "cgroup.subtree_control").read_text().split()) \
            if (root / "cgroup.subtree_control").exists() else set()
        group = self._make(root / name)
        if group is None:
            return
        self._v2 = True
        if "pids" in controllers and _write(group / "pids.max", int(max_tasks)):
            self._by["pids"] = group
        if "memory" in controllers and _write(group / "memory.max", int(memory_bytes)):
            _write(group / "memory.swap.max", 0)
            self._by["memory"] = group
        if "cpu" in controllers and _write(group / "cpu.weight", 100) and (
                max_cpus <= 0 or _write(group / "cpu.max", f"{int(max_cpus * 100000)} 100000")):
            self._by["cpu"] = group
        if (group / "cgroup.freeze").exists():
            self._by["freezer"] = group
        self.limits = [c for c in CONTROLLERS if c in self._by]
        if not self.limits:
            self.remove()

    def _make(self, path: Path) -> Path | None:
        try:
            path.mkdir()
        except OSError:
            return None
        self.groups.append(path)
        return path

    def procs_files(self) -> list[Path]:
        """The ``cgroup.procs`` file of each group (a process joins by writing its pid)."""
        return [g / "cgroup.procs" for g in self.groups]

    def pids(self) -> list[int]:
        """Every process in the kernel's groups now."""
        for group in self.groups:
            try:
                return [int(p) for p in (group / "cgroup.procs").read_text().split()]
            except (OSError, ValueError):
                continue
        return []

    # ---------------------------------------------------------------- what a cell leaves

    def record_kernel(self, launcher_pid: int) -> None:
        """Remember the sandbox's own processes (``launcher_pid``: what the grader started, the
        kernel's relay; its child bwrap; bwrap's init in the sandbox; that one's child, the
        kernel: the chain from ``launcher_pid`` down, whatever its length) right after the
        kernel is ready, before any student code runs. The kernel is the chain's end."""
        parents = {p: _ppid(p) for p in self.pids()}
        chain, pid = {launcher_pid}, launcher_pid
        while True:
            children = [p for p, parent in parents.items() if parent == pid]
            if len(children) != 1:
                break
            pid = children[0]
            chain.add(pid)
        self.kernel_pids = chain
        self.kernel_pid = pid if pid != launcher_pid else None

    def strays(self) -> list[int]:
        """Processes in the groups that are not the sandbox's own (:meth:`record_kernel`) nor
        the course's long-lived helpers (:data:`KEPT_CHILDREN`, direct children of the
        kernel)."""
        if self.kernel_pid is None:
            return []
        kernel, out = self.kernel_pid, []
        for pid in self.pids():
            stat = _stat(pid)
            if pid in self.kernel_pids or stat is None or stat[0] in ("Z", "X"):
                continue  # (a zombie has ended already: its parent has not looked yet)
            if stat[1] == kernel and any(k in _cmdline(pid) for k in KEPT_CHILDREN):
                continue
            out.append(pid)
        return out

    def end_strays(self, rounds: int = 20) -> int:
        """End every process a cell left running (:meth:`strays`), the group frozen meanwhile
        so none can fork; returns how many were ended."""
        ended: set[int] = set()
        for _ in range(rounds):
            if not self.strays():
                break
            frozen = self._freeze(True)
            try:
                for pid in self.strays():
                    try:
                        os.kill(pid, signal.SIGKILL)
                        ended.add(pid)
                    except (ProcessLookupError, PermissionError):
                        pass
            finally:
                if frozen:
                    self._freeze(False)
            time.sleep(0.02)
        return len(ended)

    def _freeze(self, on: bool) -> bool:
        group = self._by.get("freezer")
        if group is None:
            return False
        if self._v2:
            ok = _write(group / "cgroup.freeze", int(on))
            state, want = group / "cgroup.events", "frozen 1" if on else "frozen 0"
        else:
            ok = _write(group / "freezer.state", "FROZEN" if on else "THAWED")
            state, want = group / "freezer.state", "FROZEN" if on else "THAWED"
        deadline = time.monotonic() + 2.0
        while ok and time.monotonic() < deadline:
            try:
                if want in state.read_text():
                    return True
            except OSError:
                return False
            time.sleep(0.005)
        return ok

    # ---------------------------------------------------------------- accounting

    def oom_kills(self) -> int:
        """How many processes the memory limit has killed so far (0 without the limit)."""
        group = self._by.get("memory")
        if group is None:
            return 0
        name = "memory.events" if self._v2 else "memory.oom_control"
        try:
            for line in (group / name).read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        except (OSError, ValueError):
            pass
        return 0

    def peak_bytes(self) -> int | None:
        """The most memory the group has used (v1's max_usage, v2's memory.peak), if known."""
        group = self._by.get("memory")
        if group is None:
            return None
        try:
            return int((group / ("memory.peak" if self._v2 else
                                 "memory.max_usage_in_bytes")).read_text())
        except (OSError, ValueError):
            return None

    def remove(self) -> None:
        """Remove the groups (their processes have ended; the kernel takes a moment to agree)."""
        self._freeze(False)
        for group in self.groups:
            _rmdir(group)
        self.groups = []
        self._by = {}


_LIMITS_HERE: list[str] | None = None


def limits_here() -> list[str]:
    """Which cgroup controllers kernels get on this machine: a sublist of
    ``["pids", "memory", "cpu", "freezer"]``."""
    global _LIMITS_HERE
    if _LIMITS_HERE is None:
        probe = KernelCgroups(64, 2**30)
        _LIMITS_HERE = list(probe.limits)
        probe.remove()
    return _LIMITS_HERE


__all__ = ["CGROUP_PREFIX", "CONTROLLERS", "KEPT_CHILDREN", "KernelCgroups", "creator_alive",
           "limits_here", "sweep_orphans"]
