"""The class's spawners: each student's JupyterLab as that student's Unix user, in their own
home, in a sandbox: :class:`CourseSpawner` on this machine (JupyterHub's LocalProcessSpawner,
in cgroups of the student's own), :class:`CourseSlurmSpawner` as a Slurm job (batchspawner's
SlurmSpawner). What they add (:class:`StudentServer`):

* it starts servers of course accounts only (:func:`hub.accounts.is_course_account`): the
  instructor and graders have no server here (their page is the formgrader service);
* before each start, the student's ``~/workspace`` is brought up to date from the course, as the
  student: lectures the course added appear, the student's own copies are never overwritten
  (``scripts/workspace.py``, as ``make lab`` does);
* the server runs in a bubblewrap sandbox (``grading.sandbox.host_view``): an empty root with
  the system's basics, the Python environment and the students' copy of the course read-only,
  and the student's own home and nbgrader's exchange writable. Nothing else of the host is
  there: not the instructor's repository (answers), not a classmate's home, not the hub's
  database or secrets. It shares the host's network (the hub's proxy reaches it; every request
  still needs the hub's login). bwrap starts as root and the server drops to the student's
  uid with ``setpriv`` (no capability, ``no_new_privs``);
* on this machine the server and everything it starts (kernels, ranks) run in cgroups of their
  own (``grading.cgroups.KernelCgroups``: memory without swap, a CPU quota, a process limit),
  joined in the child before bwrap starts, emptied and removed when it stops; as a Slurm job,
  memory and CPUs are the job's request.
"""

from __future__ import annotations

import asyncio
import math
import os
import pwd
import signal
import subprocess
import sys
from pathlib import Path

from batchspawner import SlurmSpawner
from jupyterhub.spawner import LocalProcessSpawner
from traitlets import Float, Integer, Unicode
from traitlets.config import LoggingConfigurable

from hub.accounts import is_course_account

BIN = Path(sys.executable).parent
SINGLEUSER = str(BIN / "jupyterhub-singleuser")


class StudentServer(LoggingConfigurable):
    """What both spawners share (a mixin): course accounts only, the workspace, the sandbox."""

    course_dir = Unicode(help="the students' copy of the course the hub serves").tag(config=True)
    exchange = Unicode(help="nbgrader's exchange folder (writable in the sandbox)").tag(config=True)
    student_config = Unicode(help="the students' Jupyter configuration folder").tag(config=True)
    memory_bytes = Integer(3 << 30, help="memory per student (bytes, no swap)").tag(config=True)
    cpus = Float(1.0, help="CPUs per student (a quota)").tag(config=True)

    async def prepare(self) -> None:
        """Refuse an account the course did not make; bring the workspace up to date."""
        if not is_course_account(self.user.name):
            raise RuntimeError(f"{self.user.name} has no student server on this hub (only the "
                               f"roster's students do); the instructor's page is "
                               f"/services/formgrader/")
        await self._update_workspace()

    async def _update_workspace(self) -> None:
        home = pwd.getpwnam(self.user.name).pw_dir
        env = {"HOME": home, "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
               "COURSE_WORKSPACE": str(Path(home) / "workspace")}
        proc = await asyncio.create_subprocess_exec(
            *self.sandboxed([sys.executable, str(Path(self.course_dir) / "scripts" /
                                                 "workspace.py")]), env=env,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
        out, _ = await asyncio.wait_for(proc.communicate(), 120)
        self.log.info("workspace of %s: %s", self.user.name, out.decode(errors="replace")[-2000:])

    def sandboxed(self, cmd: list[str]) -> list[str]:
        """``cmd`` run as the student in their sandbox (see the module doc)."""
        from grading.sandbox import SETPRIV, bwrap_path, host_view

        entry = pwd.getpwnam(self.user.name)
        return [bwrap_path() or "bwrap", "--unshare-ipc", "--unshare-pid",
                "--unshare-cgroup-try", "--die-with-parent", "--new-session",
                "--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID",
                *host_view([self.course_dir, self.student_config, "/etc/passwd", "/etc/group",
                            "/etc/hosts"], [entry.pw_dir, self.exchange]),
                "--chdir", "/tmp",  # (bwrap, capless, cannot enter the 0700 home)
                # (who they are, whoever submitted: a Slurm job of root's says USER=root)
                "--setenv", "USER", entry.pw_name, "--setenv", "LOGNAME", entry.pw_name,
                "--setenv", "HOME", entry.pw_dir,
                SETPRIV, f"--reuid={entry.pw_uid}", f"--regid={entry.pw_gid}", "--clear-groups",
                "--inh-caps=-all", "--no-new-privs", "--", *cmd]


class CourseSpawner(StudentServer, LocalProcessSpawner):
    """Each server a process of this machine, in cgroups of its own (module doc)."""

    max_tasks = Integer(1024, help="processes and threads per student").tag(config=True)
    _groups = None

    async def start(self):
        await self.prepare()
        from grading.cgroups import KernelCgroups

        self._groups = KernelCgroups(self.max_tasks, self.memory_bytes, self.cpus)
        self.cmd = self.sandboxed([SINGLEUSER])
        # (not the hub's own stdout, its log: a student's process would hold that file open,
        # able to write, truncate or fill it and read it back through /proc/self/fd)
        self.popen_kwargs = {**self.popen_kwargs, "stdin": subprocess.DEVNULL,
                             "stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
        return await super().start()

    def make_preexec_fn(self, name):
        procs = [str(p) for p in self._groups.procs_files()] if self._groups else []

        def preexec():
            for path in procs:  # (as root: bwrap makes the sandbox, setpriv drops to the student)
                with open(path, "w") as f:
                    f.write(str(os.getpid()))

        return preexec

    async def stop(self, now=False):
        await super().stop(now=now)
        groups, self._groups = self._groups, None
        if groups is not None:
            for pid in groups.pids():  # (kernels and ranks the server left: the student's)
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            for _ in range(50):
                if not groups.pids():
                    break
                await asyncio.sleep(0.1)
            groups.remove()


class CourseSlurmSpawner(StudentServer, SlurmSpawner):
    """Each server a Slurm job (batchspawner): submitted by the hub (root), the job starts the
    same sandbox, in which ``batchspawner-singleuser`` tells the hub its port and becomes the
    student's JupyterLab. Memory and CPUs are asked of Slurm (``--mem``, ``--cpus-per-task``):
    Slurm's own cgroups hold them where the cluster enables them (``TaskPlugin=task/cgroup``)."""

    logs = Unicode(help="where the jobs' output goes (the hub's, not the student's)"
                   ).tag(config=True)
    exec_prefix = Unicode("")  # (the hub, root, submits; in the job, the sandbox drops to them)
    req_srun = Unicode("")
    batchspawner_singleuser_cmd = Unicode("")  # (inside the sandbox: see start)
    batch_script = Unicode("""#!/bin/bash
#SBATCH --output={{logs}}/slurm-%j.log
#SBATCH --job-name=dtp-{{username}}
#SBATCH --chdir=/tmp
#SBATCH --export={{keepvars}}
#SBATCH --mem={{memory}}
#SBATCH --cpus-per-task={{nprocs}}
{% if partition %}#SBATCH --partition={{partition}}
{% endif %}{% if options %}#SBATCH {{options}}
{% endif %}
exec {{cmd}} </dev/null >/dev/null 2>&1
""").tag(config=True)

    def get_req_subvars(self):
        subvars = super().get_req_subvars()
        subvars["logs"] = self.logs
        subvars["memory"] = subvars.get("memory") or f"{self.memory_bytes >> 20}M"
        subvars["nprocs"] = subvars.get("nprocs") or max(1, math.ceil(self.cpus))
        return subvars

    async def start(self):
        await self.prepare()
        self.cmd = self.sandboxed([str(BIN / "batchspawner-singleuser"), SINGLEUSER])
        return await super().start()
