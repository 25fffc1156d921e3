"""The judge: decides every test cell outside the student's kernel.

The trust model (docs/instructor.md, "What a grade means"):

* A hidden test cell, run in the student's sandboxed kernel, only *computes* the student's values
  (variables, and the outputs of the student's functions on the hidden inputs) and hands each to
  the grader with ``course_utils.checks.submit(name, value)``: a display output of type
  ``SUBMIT_MIME`` carrying the value as JSON data (never a pickle; :func:`decode` builds plain
  numbers, strings, lists and tensors from it, nothing else).
* The grader (``grading.preprocessors.RecoveringExecute``) reads those outputs when the cell
  ends and calls :func:`judge_cell`. The expected values are the reference solution's own
  submissions for the same names (``grading.integrity.reference_run``, run once, cached); the
  tolerances and known mistakes are the judge functions of ``authoring/judges/<assignment>.py``,
  one per test cell, named by its grade id. Neither ever enters the student's kernel.
* The verdict replaces the cell's outputs (one line when it passes, one error naming the mistake
  when not), so nbgrader's gradebook, the formgrader and the feedback show the judge's score and
  message, and the verdicts are also written to a judge log, the authoritative record that
  ``grading.integrity.report`` reads.

A cell passes only if its kernel raised no error, it submitted exactly the names the reference
submitted, in the same order, and the judge function accepts every value. A kernel can submit
anything, but it cannot submit the right value without computing it: that is the point.
"""

from __future__ import annotations

import importlib.util
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

from course_utils.checks import SUBMIT_MIME

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
    """``{name: value}`` submitted by one test cell, in order; a missing name says which."""

    def __missing__(self, name: str):
        raise AssertionError(f"no value was submitted for {name!r}")


_opaque_types: dict[str, type] = {}


def _opaque(type_name: str) -> Any:
    """A stand-in for a value the kernel could not send as data: its type keeps the name."""
    cls = _opaque_types.get(type_name)
    if cls is None:
        cls = _opaque_types[type_name] = type(str(type_name)[:80], (), {"__repr__": lambda s: f"<{type_name}>"})
    return cls()


def decode(data: Any) -> Any:
    """The value :func:`course_utils.checks.encode` sent (tensors come back as torch tensors)."""
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


def kernel_error(cell) -> tuple[str, str] | None:
    """``(ename, first line of evalue)`` of the cell's first error output, if any."""
    for o in cell.get("outputs", []):
        if o.get("output_type") == "error":
            first = (o.get("evalue") or "").strip().splitlines()[:1]
            return str(o.get("ename", "Error"))[:100], (first[0] if first else "")[:500]
    return None


def load(assignment: str) -> ModuleType:
    """``authoring/judges/<assignment>.py``: one function ``<grade_id>(got, ref)`` per test cell."""
    path = JUDGES / f"{assignment}.py"
    if not path.exists():
        raise FileNotFoundError(f"no judge for {assignment}: expected {path}")
    spec = importlib.util.spec_from_file_location(f"course_judge_{assignment}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _shown(names: list[str]) -> str:
    return ", ".join(repr(n) for n in names[:3]) + (" ..." if len(names) > 3 else "")


def judge_cell(judge: ModuleType | Callable, grade_id: str, got: list[tuple[str, Any]],
               ref: list[tuple[str, Any]], error: tuple[str, str] | None = None) -> Verdict:
    """Decide one test cell from what it submitted (``got``) and what the reference did.

    ``judge``: the assignment's judge module (its function ``grade_id`` is called as
    ``fn(got_values, ref_values)`` and raises AssertionError with the feedback message) or that
    function itself. ``error``: the kernel's own error in this cell, if any.
    """
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
        message = evalue if ename == "AssertionError" and evalue else f"{ename}: {evalue}"
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
        fn(Values((n, decode(v)) for n, v in got), Values((n, decode(v)) for n, v in ref))
    except AssertionError as err:
        return Verdict(grade_id, False, str(err).strip() or "not right", len(got))
    except Exception as err:  # noqa: BLE001 - a value the judge could not read is not right
        return Verdict(grade_id, False, f"a submitted value could not be judged "
                       f"({type(err).__name__}: {str(err)[:200]})", len(got))
    return Verdict(grade_id, True, "", len(got))


def log_path(data: Path, assignment: str, student: str, notebook: str) -> Path:
    """Where the judge's verdicts on one student's notebook are kept (outside every sandbox)."""
    return data / "judge" / assignment / student / f"{Path(notebook).stem}.json"


def write_log(path: Path, verdicts: list[Verdict], isolation: str) -> None:
    """Write the judge log of one notebook (atomic replace)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"isolation": isolation,
                               "cells": [v.as_dict() for v in verdicts]}, indent=1))
    tmp.replace(path)


def read_log(path: Path) -> dict[str, Verdict]:
    """``{grade_id: Verdict}`` from a judge log."""
    return {c["grade_id"]: Verdict(**c) for c in json.loads(path.read_text())["cells"]}
