"""Attacks on the grader itself (issue 51): its root, its log, its pages, its memory and CPU.

Each is one synthetic submission of :func:`grader_cases` with the score its answers deserve;
:func:`grading.attacks.host_cases_for` grades them beside the older attacks and honest students
(``tests/test_grading_host.py``), ``benchmarks/grading_attacks.py`` one at a time. What each
must not do, and where the suite checks it:

* ``root_knobs``: open the kernel's settings for writing (``/proc/sys/kernel/core_pattern``,
  ``vm/drop_caches``, ``kernel/pid_max``, ``/proc/sysrq-trigger``): a grader run as root once
  left them writable (its uid inside was host uid 0). It prints what opened: nothing may.
* ``grader_log``: write a marker into every file the kernel holds open (the grader's log was its
  stdout and stderr): no file of the grader's may hold it.
* ``forged_prompt``: a display message whose ``execution_count`` is markup: once it made the
  notebook invalid and a wrong submission NOT GRADED instead of 0.
* ``gif_answer``: a GIF dragged into a written answer: once its dropped attachment's reference
  stopped every student's feedback and the formgrader's page.
* ``huge_answer``: 30,000 ``\\begin{a}`` and 200,000 ``[`` in a written answer: once 38 s of
  the instructor's Jupyter server.
* ``many_frames``, ``queued_messages``, ``empty_objects``: a message of 64 frames of 30 MiB,
  60 queued messages of 30 MiB, 7 messages of 490,000 empty objects: each once took the grading
  process 1.5-2 GiB. ``metadata_objects``: 1.2 million empty objects in the notebook's
  metadata (3 GiB in every step that read it); collected as a student hands it in.
* ``message_flood``: ``flood_s`` seconds of 0.5 MB messages after the tests: once the grading
  process's CPU for as long.
"""

from __future__ import annotations

import textwrap

import nbformat

LOG_MARKER = "GRADER-LOG-WRITTEN-BY-A-KERNEL"
GIF = "R0lGODlhAQABAIAAAAAAAP///yH5BAEAAAAALAAAAAABAAEAAAIBRAA7"  # a 1x1 GIF

_ROOT_KNOBS = textwrap.dedent('''
    # The kernel's settings, opened for writing (core_pattern's own value written back).
    import os as _os
    _opened = []
    for _p in ("/proc/sys/kernel/core_pattern", "/proc/sys/vm/drop_caches",
               "/proc/sys/kernel/pid_max", "/proc/sysrq-trigger"):
        try:
            _old = open(_p).read() if _p.endswith("core_pattern") else None
            with open(_p, "w") as _f:
                _opened.append(_p)
                if _old is not None:
                    _f.write(_old)
        except OSError:
            pass
    print("opened for writing:", _opened)
''')
_GRADER_LOG = textwrap.dedent('''
    # Every file this kernel holds open (ipykernel keeps the original stdout and stderr),
    # written to, appended to, and read.
    import os as _os
    for _fd in sorted(int(f) for f in _os.listdir("/proc/self/fd")):
        try:
            _target = _os.readlink(f"/proc/self/fd/{_fd}")
        except OSError:
            continue
        if _target.startswith("/") and _target != "/dev/null":
            try:
                _os.write(_fd, b"\\n{marker} fd\\n")
                with open(f"/proc/self/fd/{_fd}", "a") as _f:
                    _f.write("{marker} reopened\\n")
            except OSError:
                pass
    for _fd in (1, 2, 42, 45):
        try:
            _os.write(_fd, b"{marker} std\\n")
        except OSError:
            pass
''')
_FORGED_PROMPT = textwrap.dedent('''
    # A display message whose execution_count is markup, sent past ipykernel's serializer.
    import json as _json
    _k = get_ipython().kernel
    _content = {{"data": {{"text/plain": "a number"}}, "metadata": {{}},
                "execution_count": "<img src=x onerror=\\"{js}\\">"}}
    _parts = [_json.dumps(_k.session.msg_header("execute_result"), default=str).encode(),
              _json.dumps(_k.get_parent().get("header", {{}}), default=str).encode(), b"{{}}",
              _json.dumps(_content).encode()]
    _k.session.send_raw(_k.iopub_socket, _parts, ident=b"execute_result")
''')
_MANY_FRAMES = textwrap.dedent('''
    # One message of 64 extra frames of 30 MiB (the same buffer, sent without copying):
    # ZMQ_MAXMSGSIZE bounds a frame, not a message.
    import json as _json, time as _time
    import zmq as _zmq
    _k = get_ipython().kernel
    _big = b"x" * (30 * 2**20)
    _parts = [_json.dumps(_k.session.msg_header("display_data"), default=str).encode(),
              _json.dumps(_k.get_parent().get("header", {}), default=str).encode(), b"{}",
              b'{"data": {"text/plain": "x"}, "metadata": {}}']
    _k.session.send_raw(_k.iopub_socket, _parts + [_zmq.Frame(_big)] * 64,
                        ident=b"display_data")
    _time.sleep(2)
''')
_QUEUED = textwrap.dedent('''
    # 60 messages of 30 MiB each, under the message limit, sent at once (a receive queue
    # counts messages, not bytes).
    import json as _json, time as _time
    _k = get_ipython().kernel
    _content = b'{"data": {"text/plain": "' + b"x" * (30 * 2**20) + b'"}, "metadata": {}}'
    _head = [_json.dumps(_k.get_parent().get("header", {}), default=str).encode(), b"{}", _content]
    for _ in range(60):
        _k.session.send_raw(_k.iopub_socket, [_json.dumps(_k.session.msg_header(
            "display_data"), default=str).encode(), *_head], ident=b"display_data")
    _time.sleep(2)
''')
_EMPTY_OBJECTS = textwrap.dedent('''
    # 7 messages of 490,000 empty objects each (under the item limit, 1.5 MB each).
    import json as _json, time as _time
    _k = get_ipython().kernel
    _content = (b'{"data": {"text/plain": "x", "application/json": ['
                + b"{},".join([b""] * 490_000) + b'{}]}, "metadata": {}}')
    for _ in range(7):
        _k.session.send_raw(_k.iopub_socket, [_json.dumps(_k.session.msg_header(
            "display_data"), default=str).encode(),
            _json.dumps(_k.get_parent().get("header", {}), default=str).encode(), b"{}", _content],
            ident=b"display_data")
    _time.sleep(1)
''')
_FLOOD = textwrap.dedent('''
    # {seconds} s of 0.5 MB messages, after the tests (the grading process parsed each).
    import time as _time
    _line = "y" * 500_000
    _end = _time.monotonic() + {seconds}
    while _time.monotonic() < _end:
        print(_line, flush=True)
''')
HUGE_ANSWER = "My answer. " + "\\begin{a}" * 30_000 + "\n\n" + "[" * 200_000


def _added(nb, source: str):
    nb.cells.append(nbformat.v4.new_code_cell(source))
    return nb


def _answer_cell(nb):
    return next(c for c in nb.cells if c.cell_type == "markdown"
                and c.get("metadata", {}).get("nbgrader", {}).get("solution"))


def with_junk_metadata(nb, objects: int = 1_200_000) -> str:
    """``nb`` as JSON text with ``objects`` empty objects in its metadata (written as text:
    the test process never builds them)."""
    text = nbformat.writes(nb)
    junk = '"course_junk": [' + "{}," * (objects - 1) + "{}], "
    return text.replace('"metadata": {', '"metadata": {' + junk, 1) if objects else text


def grader_cases(notebook, full: float, correct: dict, wrong: dict, add, js: str,
                 flood_s: float = 12.0) -> None:
    """Add the attacks of the module doc: ``notebook(answers)`` builds a submission (``full``
    points when right), ``add(kind, deserved, nb, **case)`` records one; ``js``: the script a
    page must never run."""
    add("root_knobs", full, _added(notebook(correct), _ROOT_KNOBS))
    add("grader_log", full, _added(notebook(correct),
                                   _GRADER_LOG.replace("{marker}", LOG_MARKER)))
    add("forged_prompt", 0.0, _added(notebook(wrong), _FORGED_PROMPT.format(js=js)))
    gif = notebook(correct)
    cell = _answer_cell(gif)
    cell.source = "My explanation, with a picture: ![moving](attachment:moving.gif)"
    cell["attachments"] = {"moving.gif": {"image/gif": GIF}}
    add("gif_answer", full, gif)
    huge = notebook(correct)
    _answer_cell(huge).source = HUGE_ANSWER
    add("huge_answer", full, huge)
    add("many_frames", full, _added(notebook(correct), _MANY_FRAMES))
    add("queued_messages", full, _added(notebook(correct), _QUEUED),
        limits=["MB of output in one cell"])
    add("empty_objects", full, _added(notebook(correct), _EMPTY_OBJECTS),
        limits=["MB of output in one cell"])
    add("metadata_objects", full, with_junk_metadata(notebook(correct)), inbox=True)
    add("message_flood", full, _added(notebook(correct), _FLOOD.format(seconds=flood_s)),
        limits=["MB of output in one cell"])


GRADER_ATTACKS = ["root_knobs", "grader_log", "forged_prompt", "gif_answer", "huge_answer",
                  "many_frames", "queued_messages", "empty_objects", "metadata_objects",
                  "message_flood"]

__all__ = ["GIF", "GRADER_ATTACKS", "HUGE_ANSWER", "LOG_MARKER", "grader_cases",
           "with_junk_metadata"]
