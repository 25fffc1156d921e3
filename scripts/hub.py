#!/usr/bin/env python
"""The class's JupyterHub on this machine (run as root: one Unix account per student).

    python scripts/hub.py up [--port 8000] [--ip 0.0.0.0]   # make hub: Ctrl-C stops everything
                             [--spawner slurm]              # servers as Slurm jobs (batchspawner)
    python scripts/hub.py release  a1_training_state        # into nbgrader's exchange
    python scripts/hub.py collect  a1_training_state        # the exchange -> $COURSE_DATA/submitted
    python scripts/hub.py feedback a1_training_state        # pages made and handed back
    python scripts/hub.py password alice                    # a new first password for one student
    python scripts/hub.py update                            # after `git pull`: the course's update

Grading between collect and feedback is the course's own: ``scripts/grade.py autograde A``.
The roster is ``$COURSE_DATA/roster.csv`` (the grader's: ``id,first_name,last_name,email``).
The hub keeps its state in ``$COURSE_HUB`` (default ``/srv/dtp-hub``): ``private/`` (root only:
the hub's database, cookie secret, passwords, the first-password handout, collected
submissions), ``course/`` (the students' copy of the course, no answers), ``exchange/``
(nbgrader's), ``student-config/``. docs/instructor.md, "A class on JupyterHub", walks a term.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from grading.course import data_dir, roster  # noqa: E402
from hub import accounts, exchange  # noqa: E402
from hub.client import free_port  # noqa: E402

DEFAULT_STATE = Path(os.environ.get("COURSE_HUB") or "/srv/dtp-hub")
PROXY = ROOT / ".venv" / "node" / "node_modules" / ".bin" / "configurable-http-proxy"
def _students(data: Path) -> list[str]:
    students = sorted(roster(data))
    if not students:
        raise SystemExit(f"hub: no students: put the roster in {data / 'roster.csv'} (columns "
                         f"id,first_name,last_name,email)")
    for s in students:
        accounts.check_unix_name(s)
    return students


def _layout(state: Path) -> dict[str, Path]:
    return {"state": state, "private": state / "private", "course": state / "course",
            "exchange": state / "exchange", "student_config": state / "student-config"}


def _settings(state: Path) -> dict:
    path = _layout(state)["private"] / "settings.json"
    if not path.exists():
        raise SystemExit(f"hub: no hub in {state} (start one with `scripts/hub.py up`)")
    return json.loads(path.read_text())


def _student_config(folder: Path, exchange_root: Path) -> None:
    if folder.exists():
        shutil.rmtree(folder)
    shutil.copytree(ROOT / "jupyter" / "hub-student", folder)
    (folder / "nbgrader_config.py").write_text(
        "import os\n"
        "c = get_config()  # noqa: F821\n"
        f"c.CourseDirectory.course_id = {exchange.COURSE_ID!r}\n"
        "# (fetched assignments and feedback land in the student's workspace, beside lectures/)\n"
        "c.Exchange.assignment_dir = os.path.join(os.path.expanduser('~'), 'workspace')\n"
        f"c.Exchange.root = {str(exchange_root)!r}\n")
    for top, dirs, files in os.walk(folder):
        os.chmod(top, 0o755)
        for f in files:
            os.chmod(os.path.join(top, f), 0o644)


def course_copy(dest: Path) -> Path:
    """The students' copy of the course (``scripts/student_copy.py``: no answers), readable by
    all, without ``assignments/`` (they come through the exchange); returns its folder.
    ``dest`` is a link to the newest version (``dest-<time>``): a server starts on the version
    the link names then and keeps it while it runs (an older version is never changed)."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import student_copy

    version = dest.with_name(f"{dest.name}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}")
    student_copy.build(version, archive=False)
    shutil.rmtree(version / "assignments")
    subprocess.run(["chmod", "-R", "u=rwX,go=rX", str(version)], check=True)
    link = dest.with_name(dest.name + ".link")
    link.unlink(missing_ok=True)
    link.symlink_to(version.name)
    os.replace(link, dest)
    return version


def _handout(private: Path, given: dict[str, str]) -> Path:
    path = private / "handout.csv"
    new = not path.exists()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w", newline="") as f:
        w = csv.writer(f)
        if new:
            w.writerow(["id", "first_password"])
        for who, pw in sorted(given.items()):
            w.writerow([who, pw])
    return path


def prepare(state: Path, data: Path, homes: Path, instructor: str, graders: list[str],
            port: int, ip: str, memory_gb: float, cpus: float, cull_timeout: int,
            spawner: str = "local") -> dict:
    """Everything the hub needs before it starts (accounts, folders, settings); returns the
    settings (also in ``private/settings.json``)."""
    if os.getuid() != 0:
        raise SystemExit("hub: run as root (the hub makes one Unix account per student and "
                         "starts each student's server as that account)")
    from grading.sandbox import bwrap_path

    if bwrap_path() is None:
        raise SystemExit("hub: bubblewrap is missing (each student's server runs in its "
                         "sandbox): apt-get install bubblewrap")
    if not os.access(PROXY, os.X_OK):
        raise SystemExit(f"hub: configurable-http-proxy is missing ({PROXY}); `make setup` "
                         f"installs it when npm is present (apt-get install nodejs npm)")
    students = _students(data)
    staff = sorted({instructor, *graders})
    clash = set(staff) & set(students)
    if clash:
        raise SystemExit(f"hub: {', '.join(sorted(clash))} is both staff and a student")
    where = _layout(state)
    state.mkdir(parents=True, exist_ok=True)
    os.chmod(state, 0o711)
    where["private"].mkdir(exist_ok=True)
    os.chmod(where["private"], 0o700)
    (where["private"] / "slurm").mkdir(exist_ok=True)  # (the Slurm jobs' output)
    if spawner == "slurm" and not shutil.which("sbatch"):
        raise SystemExit("hub: --spawner slurm needs Slurm's sbatch here (Debian: slurm-wlm; a "
                         "one-node Slurm for trying: scripts/slurm_local.sh start)")
    data.mkdir(parents=True, exist_ok=True)
    os.chmod(data, 0o700)
    homes.mkdir(parents=True, exist_ok=True)
    for s in students:
        accounts.ensure_account(s, homes)
    course_copy(where["course"])
    _student_config(where["student_config"], where["exchange"])
    exchange.prepare(where["exchange"])
    given = accounts.seed_passwords(students + staff, where["private"] / "passwords.dbm")
    settings = {
        "state": str(state), "private": str(where["private"]), "course_dir": str(where["course"]),
        "exchange": str(where["exchange"]), "student_config": str(where["student_config"]),
        "data": str(data), "repo": str(ROOT), "homes": str(homes), "students": students,
        "staff": staff, "instructor": instructor, "ip": ip, "port": port,
        "hub_port": free_port(), "proxy_api_port": free_port(),
        "formgrader_port": free_port(), "proxy": str(PROXY),
        "memory_bytes": int(memory_gb * 2**30), "cpus": cpus,
        "cull_timeout": cull_timeout, "cull_every": max(10, min(300, cull_timeout // 2)),
        "spawner": spawner,
        "handout": str(_handout(where["private"], given)),
    }
    path = where["private"] / "settings.json"
    path.write_text(json.dumps(settings, indent=1))
    os.chmod(path, 0o600)
    return settings


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def _end_student_processes(students: list[str]) -> None:
    for s in students:
        subprocess.run(["pkill", "-KILL", "-u", s], capture_output=True)


def up(settings: dict) -> int:
    """Run the hub in the foreground until Ctrl-C or SIGTERM; then nothing of it is left."""
    private = Path(settings["private"])
    env = dict(os.environ, COURSE_HUB_SETTINGS=str(private / "settings.json"),
               PYTHONPATH=str(ROOT), COURSE_DATA=settings["data"])
    log = private / "jupyterhub.log"
    cmd = [str(ROOT / ".venv" / "bin" / "jupyterhub"), "-f",
           str(ROOT / "hub" / "jupyterhub_config.py")]
    stop = {"signal": None}

    def on_signal(signum, _frame):
        stop["signal"] = signum

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, on_signal)
    with log.open("a") as out:
        proc = subprocess.Popen(cmd, cwd=private, env=env, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    url = f"http://{settings['ip'] if settings['ip'] != '0.0.0.0' else socket.getfqdn()}:" \
          f"{settings['port']}/"
    t0 = time.monotonic()
    while proc.poll() is None and stop["signal"] is None and not _answers(
            f"http://127.0.0.1:{settings['port']}/hub/api/"):
        if time.monotonic() - t0 > 120:
            break
        time.sleep(0.2)
    if proc.poll() is None and stop["signal"] is None:
        print(f"hub: the class's JupyterHub answers at {url} ({time.monotonic() - t0:.1f} s)\n"
              f"hub: hand each student their id and first password from {settings['handout']} "
              f"(they change it at {url}hub/auth/change-password)\n"
              f"hub: the formgrader: {url}services/formgrader/ (instructor and graders)\n"
              f"hub: the log: {log}; Ctrl-C stops the hub and every student's server",
              flush=True)
    while proc.poll() is None and stop["signal"] is None:
        time.sleep(0.2)
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)  # (the hub stops every server, then its proxy)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # (services and the proxy it started, if any left)
    except ProcessLookupError:
        pass
    _end_student_processes(settings["students"])
    if stop["signal"] is not None:
        print("hub: stopped; no hub, proxy or student process is left", flush=True)
        return 0
    print(f"hub: JupyterHub exited ({proc.returncode}); its log: {log}\n"
          f"{log.read_text()[-3000:]}", file=sys.stderr)
    return 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--state", type=Path, default=DEFAULT_STATE,
                        help=f"the hub's folder (default $COURSE_HUB or {DEFAULT_STATE})")
    sub = parser.add_subparsers(dest="step", required=True)
    p = sub.add_parser("up", help="bring the hub up (foreground; Ctrl-C stops it)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--ip", default="0.0.0.0", help="where the hub listens (127.0.0.1: this "
                                                   "machine only)")
    p.add_argument("--homes", type=Path, default=Path("/home"),
                   help="where students' homes are made (default /home)")
    p.add_argument("--instructor", default="instructor",
                   help="the instructor's hub name (the formgrader's user; no server)")
    p.add_argument("--graders", default="", help="comma-separated hub names of graders")
    p.add_argument("--memory-gb", type=float, default=3.0, help="memory per student (GiB)")
    p.add_argument("--cpus", type=float, default=1.0, help="CPUs per student")
    p.add_argument("--cull-timeout", type=int, default=3600,
                   help="stop a student's server idle this many seconds")
    p.add_argument("--spawner", choices=("local", "slurm"), default="local",
                   help="each student's server a process of this machine (local) or a Slurm "
                        "job (slurm: batchspawner; sbatch must work here, as root)")
    for step in ("release", "collect", "feedback"):
        sub.add_parser(step).add_argument("assignment")
    sub.add_parser("password", help="a new first password for one student").add_argument("id")
    sub.add_parser("update", help="after a course update (git pull): each student gets the new "
                                  "and changed lectures at their server's next start; their own "
                                  "copies are kept")
    args = parser.parse_args(argv)
    data = data_dir()
    if args.step == "up":
        try:
            settings = prepare(args.state.resolve(), data, args.homes, args.instructor,
                               [g for g in args.graders.split(",") if g], args.port, args.ip,
                               args.memory_gb, args.cpus, args.cull_timeout, args.spawner)
        except ValueError as err:  # (a roster id that cannot be an account, named)
            print(f"hub: {err}", file=sys.stderr)
            return 2
        return up(settings)
    settings = _settings(args.state.resolve())
    ex, private, data = (Path(settings["exchange"]), Path(settings["private"]),
                         Path(settings["data"]))
    if args.step == "release":
        exchange.release(args.assignment, ex, data)
        print(f"hub: released {args.assignment}: students fetch it in JupyterLab's "
              f"Assignments tab")
    elif args.step == "collect":
        got = exchange.collect(args.assignment, ex, private, data, settings["students"])
        for a in exchange.workflow.expand(args.assignment):
            print(f"{a}: collected {len(got.collected.get(a, []))} submission(s) into "
                  f"{data / 'submitted'}")
            for student, why in sorted(got.collected.missing.get(a, {}).items()):
                print(f"  {student}: {why}")
        for entry, why in sorted(got.refused.items()):
            print(f"  REFUSED {entry}: {why}")
    elif args.step == "feedback":
        from grading import workflow

        workflow.feedback(args.assignment, data)
        for a in workflow.expand(args.assignment):
            served = exchange.release_feedback(a, ex, private, data)
            print(f"{a}: feedback released to {len(served)} student(s); they fetch it in the "
                  f"Assignments tab")
    elif args.step == "update":
        course_copy(Path(settings["course_dir"]))
        print("hub: the course is updated; each student's workspace gets it at their server's "
              "next start (new lectures added; their own copies kept, a newer version named)")
    elif args.step == "password":
        if args.id not in settings["students"] + settings["staff"]:
            raise SystemExit(f"hub: {args.id!r} is not on this hub")
        pw = accounts.new_password(args.id, private / "passwords.dbm")
        print(f"hub: {args.id}'s new first password is in {_handout(private, {args.id: pw})}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
