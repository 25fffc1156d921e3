"""The judge: decides every test cell outside the student's kernel.

The trust model (docs/instructor.md, "What a grade means"):

* A hidden test cell, run in the student's sandboxed kernel, only *computes* the student's values
  (variables, and the outputs of the student's functions on the hidden inputs) and hands each to
  the grader with ``course_utils.assess.checks.submit(name, value)``: a display output of type
  ``SUBMIT_MIME`` carrying the value as JSON data (never a pickle; :func:`decode` builds plain
  numbers, strings, lists and tensors from it, nothing else).
* The grader (``grading.preprocessors.RecoveringExecute``) reads those outputs when the cell
  ends and calls :func:`judge_cell`. The expected values are the reference solution's own
  submissions for the same names (``grading.reference.reference_run``, run once, cached); the
  tolerances and known mistakes are the judge functions of ``authoring/judges/<assignment>.py``,
  one per test cell, named by its grade id. Neither ever enters the student's kernel.
* The verdict replaces the cell's outputs (one line when it passes, one error naming the mistake
  when not), so nbgrader's gradebook, the formgrader and the feedback show the judge's score and
  message, and the verdicts are also written to a judge log, the authoritative record that
  ``grading.report`` reads.

A cell passes only if its kernel raised no error, it submitted exactly the names the reference
submitted, in the same order, and the judge function accepts every value. A kernel can submit
anything, but it cannot submit the right value without computing it: that is the point.

**Hidden inputs drawn per submission.** A judge module may name, in ``HIDDEN_CASES``, a draw
function per test cell (``draw(rng: random.Random) -> list``). The grader draws each submission's
cases from a key that the student cannot know in advance (:func:`submission_key`: an HMAC, with
the course's secret in ``$COURSE_DATA``, of the assignment, the student and the submission's
code), passes them to the kernel (``checks.hidden_cases``) and to the judge function
(``got.cases``; the reference's, drawn from the fixed key ``"reference"``, are ``ref.cases``).
A table of one submission's cases is worthless for another student, and for the same student's
next submission. The judge's messages describe a failing case by its number, never its inputs.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import importlib.util
import json
import os
import random
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

from course_utils.assess.checks import SUBMIT_MIME
from grading.files import read_regular, write_private

ROOT = Path(__file__).resolve().parent.parent
JUDGES = ROOT / "authoring" / "judges"
MAX_SUBMISSION_BYTES = 2_000_000  # all values of one test cell, as JSON


@dataclass
class Verdict:
    """The judge's decision on one test cell."""

    grade_id: str
    passed: bool
    message: str
    submitted: int = 0  # values the kernel submitted

    def as_dict(self) -> dict:
        return asdict(self)


class Values(dict):
    """``{name: value}`` submitted by one test cell, in order; a missing name says which.
    ``cases``: the hidden inputs the grader drew for this cell (``HIDDEN_CASES``), or None.
    ``givens``: the student's own numbers (``course_utils.assess.variants.Givens``), drawn by the
    grader from nbgrader's student id (never read from the notebook), or None."""

    cases: Any = None
    givens: Any = None

    def __missing__(self, name: str):
        raise AssertionError(f"no value was submitted for {name!r}")


def _values(pairs, cases, givens=None) -> Values:
    out = Values((n, decode(v)) for n, v in pairs)
    out.cases, out.givens = cases, givens
    return out


@functools.lru_cache(maxsize=256)
def _opaque_type(type_name: str) -> type:
    return type(type_name, (), {"__repr__": lambda s: f"<{type_name}>"})


def _opaque(type_name: str) -> Any:
    """A stand-in for a value the kernel could not send as data: its type keeps the name (at
    most 80 characters, control characters escaped). At most 256 such types are kept, whatever
    a submission sends (a cache without a bound grew by one class per distinct name, 90,000 a
    cell, for every later student of the worker)."""
    from grading.inert import one_line

    return _opaque_type(one_line(type_name, 80))()


def decode(data: Any) -> Any:
    """The value :func:`course_utils.assess.checks.encode` sent (tensors come back as torch tensors)."""
    if data is None or isinstance(data, (bool, int, float, str)):
        return data
    if isinstance(data, list):
        return [decode(v) for v in data]
    if isinstance(data, dict) and len(data) == 1:
        (tag, body), = data.items()
        if tag == "$float" and body in ("nan", "inf", "-inf"):
            return float(body)
        if tag == "$dict" and isinstance(body, list):
            out = {}
            for pair in body:
                if isinstance(pair, list) and len(pair) == 2:
                    key = decode(pair[0])
                    out[key if isinstance(key, (str, int, float, bool)) or key is None
                        else repr(key)] = decode(pair[1])
            return out
        if tag == "$tensor" and isinstance(body, dict):
            return _tensor(body)
        if tag == "$type":
            return _opaque(str(body))
    return _opaque("malformed submission")


def _tensor(body: dict) -> Any:
    import torch

    try:
        dtype = getattr(torch, str(body["dtype"]))
        if not isinstance(dtype, torch.dtype):
            raise TypeError
        shape = [int(n) for n in body["shape"]]
        data = torch.tensor([float(x) for x in body["data"]], dtype=torch.float64)
        return data.reshape(shape).to(dtype)
    except Exception:  # noqa: BLE001 - anything malformed is a wrong answer, not a crash
        return _opaque("malformed tensor")


def submissions(cell) -> list[tuple[str, Any]]:
    """``[(name, encoded value)]`` a test cell submitted, in order (from its outputs)."""
    out = []
    for o in cell.get("outputs", []):
        rec = o.get("data", {}).get(SUBMIT_MIME) if o.get("output_type") == "display_data" else None
        if isinstance(rec, dict) and isinstance(rec.get("name"), str):
            out.append((rec["name"], rec.get("value")))
    return out


NOT_ANSWERED = "not answered (its answer cell still raises NotImplementedError)"
_BARE_PLACEHOLDER = re.compile(r"\bNotImplementedError(?!\s*:\s*\S)")  # raised with no message
PLACEHOLDER = "raise NotImplementedError"  # nbgrader's stub in a released answer cell


def answer_source(cells, grade_id: str) -> str | None:
    """The source of the answer cell of test cell ``grade_id`` (``q4`` for ``q4_test``) among
    ``cells``, or None."""
    want = grade_id.removesuffix("_test")
    for cell in cells:
        meta = (cell.get("metadata") or {}).get("nbgrader") or {}
        if meta.get("solution") and meta.get("grade_id") == want:
            source = cell.get("source", "")
            return "".join(source) if isinstance(source, list) else str(source)
    return None


def not_answered(error: tuple[str, str] | None, answer: str | None = None) -> bool:
    """Is ``error`` (a test cell's kernel error) that of a question not answered yet? The
    placeholder raised (NotImplementedError with no message, in the kernel or on a rank), or a
    missing name or the placeholder while the answer cell (``answer``) still holds it. A check
    that failed is never "not answered", placeholder or not."""
    if error is None:
        return False
    ename, evalue = error
    if ename == "RankError":  # "rank 1 failed first: NotImplementedError[: message]"
        ename, _, evalue = evalue.partition("failed first: ")[2].partition(": ")
    if ename == "NotImplementedError" and not evalue.strip():
        return True
    return (ename in ("NotImplementedError", "NameError", "KeyError") and answer is not None
            and PLACEHOLDER in answer)


def kernel_error(cell) -> tuple[str, str] | None:
    """``(ename, first line of evalue)`` of the cell's first error output, if any, each one
    line with its control characters escaped (a student names the exception)."""
    from grading.inert import one_line

    for o in cell.get("outputs", []):
        if o.get("output_type") == "error":
            first = str(o.get("evalue") or "").strip().splitlines()[:1]
            return (one_line(o.get("ename", "Error"), 100),
                    one_line(first[0] if first else "", 500))
    return None


_LOADED: dict[tuple[Path, str], ModuleType] = {}


def load(assignment: str, fresh: bool = False) -> ModuleType:
    """``authoring/judges/<assignment>.py``: one function ``<grade_id>(got, ref)`` per test cell.

    Loaded once per process and file content (its functions' caches, such as a11's simulated
    jobs, then serve every later judgement); ``fresh``: a module of its own (the grader's, one
    per submission)."""
    path = JUDGES / f"{assignment}.py"
    if not path.exists():
        raise FileNotFoundError(f"no judge for {assignment}: expected {path}")
    key = (path, hashlib.sha256(path.read_bytes()).hexdigest())
    if not fresh and key in _LOADED:
        return _LOADED[key]
    spec = importlib.util.spec_from_file_location(f"course_judge_{assignment}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not fresh:
        _LOADED[key] = module
    return module


def _shown(names: list[str]) -> str:
    return ", ".join(repr(n) for n in names[:3]) + (" ..." if len(names) > 3 else "")


def judge_cell(judge: ModuleType | Callable, grade_id: str, got: list[tuple[str, Any]],
               ref: list[tuple[str, Any]], error: tuple[str, str] | None = None,
               cases: Any = None, ref_cases: Any = None, givens: Any = None,
               answer: str | None = None) -> Verdict:
    """Decide one test cell from what it submitted (``got``) and what the reference did.

    ``judge``: the assignment's judge module (its function ``grade_id`` is called as
    ``fn(got_values, ref_values)`` and raises AssertionError with the feedback message) or that
    function itself. ``error``: the kernel's own error in this cell, if any. ``cases`` /
    ``ref_cases``: the hidden inputs drawn for the submission and for the reference. Whatever
    the values are (nested a million deep, huge, malformed), the verdict is a Verdict: an
    error while judging is this cell's 0 with the reason, never the grader's crash.
    ``givens``: the student's own numbers (``got.givens`` in the judge function; the
    reference's, run with the base numbers, are ``ref.givens``). ``answer``: the source of the
    cell's answer cell (:func:`answer_source`): an error of a question not answered yet is
    :data:`NOT_ANSWERED` (:func:`not_answered`).
    """
    if not_answered(error, answer):
        return Verdict(grade_id, False, NOT_ANSWERED, len(got))
    try:
        verdict = _judge_cell(judge, grade_id, got, ref, error, cases, ref_cases, givens)
    except Exception as err:  # noqa: BLE001 - RecursionError, MemoryError on hostile data
        return Verdict(grade_id, False, f"the grader could not judge this cell "
                       f"({type(err).__name__}); it scores 0", 0)
    if (not verdict.passed and answer is not None and PLACEHOLDER in answer
            and _BARE_PLACEHOLDER.search(verdict.message or "")):
        # a function still holding the placeholder, run by the test cell on hidden cases or on
        # ranks ("weighted_average_grad failed on 2 real ranks: rank 1 failed first:
        # NotImplementedError"): the question is not answered yet
        return Verdict(grade_id, False, NOT_ANSWERED, verdict.submitted)
    return verdict


def _judge_cell(judge, grade_id, got, ref, error, cases, ref_cases, givens) -> Verdict:
    fn = judge if callable(judge) else getattr(judge, grade_id, None)
    if fn is None:
        return Verdict(grade_id, False, f"the grader has no judge for test cell {grade_id}")
    if not ref:
        return Verdict(grade_id, False, f"the reference solution submitted nothing in {grade_id}")
    if len(json.dumps(got)) > MAX_SUBMISSION_BYTES:
        return Verdict(grade_id, False, f"the values submitted are larger than "
                       f"{MAX_SUBMISSION_BYTES // 1_000_000} MB", len(got))
    got_names, ref_names = [n for n, _ in got], [n for n, _ in ref]
    if error is not None:
        ename, evalue = error
        message = (evalue if ename in ("AssertionError", "CheckFailed") and evalue
                   else f"{ename}: {evalue}")
        return Verdict(grade_id, False, message.strip().rstrip(":"), len(got))
    if got_names != ref_names:
        if got_names == ref_names[:len(got_names)]:
            why = f"the test stopped before submitting {_shown(ref_names[len(got_names):])}"
        else:
            extra = [n for n in got_names if n not in ref_names]
            why = (f"the test submitted values it should not ({_shown(extra)})" if extra
                   else "the test submitted its values out of order")
        return Verdict(grade_id, False, why, len(got))
    try:
        base = None if givens is None else _base_givens(givens)
        fn(_values(got, cases, givens), _values(ref, ref_cases, base))
    except AssertionError as err:
        return Verdict(grade_id, False, str(err).strip() or "not right", len(got))
    except Exception as err:  # noqa: BLE001 - a value the judge could not read is not right
        return Verdict(grade_id, False, f"a submitted value could not be judged "
                       f"({type(err).__name__}: {str(err)[:200]})", len(got))
    return Verdict(grade_id, True, "", len(got))


def _base_givens(givens):
    from course_utils.assess import variants

    return variants.Givens(givens.assignment, variants.base(givens.assignment), None)


# ------------------------------------------------------------------------------ hidden cases

SECRET_FILE = "secret.key"
REFERENCE_KEY = "reference"


def course_secret(data: Path) -> bytes:
    """The course's secret (``$COURSE_DATA/secret.key``, 32 random bytes, made on first use,
    mode 0600): without it nobody can tell which hidden cases a submission will get."""
    import time

    path = Path(data) / SECRET_FILE
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        for _ in range(100):  # another grader made it a moment ago: wait for its 32 bytes
            secret = read_regular(path, 1024)
            if len(secret) >= 32:
                return secret
            time.sleep(0.01)
        raise RuntimeError(f"{path} holds no secret: delete it and grade again") from None
    with os.fdopen(fd, "wb") as f:
        secret = os.urandom(32)
        f.write(secret)
    return secret


def submission_key(data: Path, assignment: str, student: str, code: list[str]) -> str:
    """The key a submission's hidden cases are drawn from: an HMAC with the course's secret of
    the assignment, the student and the code of the submission's cells (a resubmission with
    other code gets other cases; grading the same submission again gets the same)."""
    message = json.dumps([assignment, student, code]).encode()
    return hmac.new(course_secret(data), message, hashlib.sha256).hexdigest()[:32]


def hidden_cases(rules: ModuleType | None, key: str) -> dict[str, Any]:
    """``{grade_id: cases}`` drawn from ``key`` by the judge module's ``HIDDEN_CASES``
    (JSON-shaped, as the kernel gets them: tuples become lists)."""
    draws = getattr(rules, "HIDDEN_CASES", {}) if rules is not None else {}
    return json.loads(json.dumps({gid: draw(random.Random(f"{key}/{gid}"))
                                  for gid, draw in draws.items()}))


def prepare(rules: ModuleType | None, cases: dict[str, Any]) -> None:
    """Let the judge module start what it will need for these hidden cases (its optional
    ``prepare(cases)``: one-process reference runs, say) on a thread of its own while the
    kernel runs; a failure there only means the judge computes it when it judges."""
    start = getattr(rules, "prepare", None)
    if start is None or not cases:
        return
    try:
        start(cases)
    except Exception:  # noqa: BLE001 - the judge's own computation will say what is wrong
        pass


def log_path(data: Path, assignment: str, student: str, notebook: str) -> Path:
    """Where the judge's verdicts on one student's notebook are kept (outside every sandbox)."""
    return data / "judge" / assignment / student / f"{Path(notebook).stem}.json"


MAX_LOGGED_VALUES = 20_000  # bytes of JSON kept per failed cell, for the copied-answer check


def write_log(path: Path, verdicts: list[Verdict], isolation: str,
              limits: list[str] | None = None, values: dict | None = None,
              variant: str | None = None, seconds: float | None = None,
              grader: dict | None = None) -> None:
    """Write the judge log of one notebook (atomic replace): the verdicts, how the kernel was
    isolated, each limit that fired while it ran (``limits``: one line each), and, for the
    report's copied-answer evidence (issue 26), the student's ``variant`` and the values of
    each failed cell (``values``: ``{grade_id: [(name, encoded value)]}``, a cell's kept only
    up to ``MAX_LOGGED_VALUES`` bytes); ``seconds``: how long running and judging the notebook
    took, kernel start-ups included (the class report's slowest submissions); ``grader``: what
    it cost the grading process itself (``cpu_s``, ``peak_mb``: :func:`read_grader_cost`)."""
    kept = {gid: pairs for gid, pairs in (values or {}).items()
            if len(json.dumps(pairs)) <= MAX_LOGGED_VALUES}
    path.parent.mkdir(parents=True, exist_ok=True)
    write_private(path, json.dumps({"isolation": isolation, "limits": list(limits or []),
                                    "cells": [v.as_dict() for v in verdicts],
                                    "variant": variant, "values": kept,
                                    "seconds": None if seconds is None else round(seconds, 2),
                                    "grader": grader or {}},
                                   indent=1))


MAX_LOG_BYTES = 50_000_000


def read_log(path: Path) -> dict[str, Verdict]:
    """``{grade_id: Verdict}`` from a judge log."""
    return {c["grade_id"]: Verdict(**c) for c in _log(path)["cells"]}


def read_values(path: Path) -> tuple[str | None, dict[str, list[tuple[str, Any]]]]:
    """``(variant, {grade_id: [(name, encoded value)]})`` of the failed cells of a judge log."""
    log = _log(path)
    values = log.get("values") if isinstance(log.get("values"), dict) else {}
    return log.get("variant"), {str(g): [tuple(p) for p in pairs if isinstance(p, list)
                                         and len(p) == 2 and isinstance(p[0], str)]
                                for g, pairs in values.items() if isinstance(pairs, list)}


def read_grader_cost(path: Path) -> dict[str, float]:
    """What grading the notebook of this judge log cost the grading process: ``cpu_s`` (its
    own CPU seconds, the kernel's not counted) and ``peak_mb`` (the process's peak resident
    memory when the notebook was done); empty if not recorded."""
    cost = _log(path).get("grader")
    return {k: float(v) for k, v in (cost or {}).items() if k in ("cpu_s", "peak_mb")
            and isinstance(v, (int, float))} if isinstance(cost, dict) else {}


def read_seconds(path: Path) -> float | None:
    """How long the notebook of this judge log took to run and judge (None: not recorded)."""
    value = _log(path).get("seconds")
    return float(value) if isinstance(value, (int, float)) else None


def read_limits(path: Path) -> list[str]:
    """The limits that fired while the notebook of this judge log ran."""
    return [str(x) for x in _log(path).get("limits", [])]


def _log(path: Path) -> dict:
    return json.loads(read_regular(path, MAX_LOG_BYTES))
