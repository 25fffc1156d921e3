"""Student content made inert, wherever a person reads it (issue 41).

Everything a submission holds is hostile: an output, a written answer, an exception's name, a
metadata key. Two places read them:

* **Pages** (the formgrader's submission view, the feedback page, the class report): a cell's
  output of type HTML, JavaScript, SVG, Markdown or LaTeX, or a written answer's raw HTML,
  would run as script in the instructor's browser, inside their authenticated Jupyter session.
  ``grading.filters.InertStudentContent`` (an nbgrader preprocessor of autograde) leaves in a submission only what renders as text or as a picture:
  plain-text outputs, and PNG/JPEG outputs whose data is base64 (nothing else can break out of
  the ``<img src="data:...">`` attribute); every other output becomes a text line saying what
  was removed, and output metadata (nbconvert writes some of it into HTML attributes) is
  dropped. The markdown a student wrote has its HTML shown as text (``<`` and ``&`` escaped)
  and its link schemes that can run code (``javascript:``, ``vbscript:``, ``data:``) broken,
  with a note at the end of the cell; attachments other than base64 PNG/JPEG are dropped.
  nbconvert's own sanitizer (``HTMLExporter.sanitize_html``, set in ``nbgrader_config.py`` for
  feedback and the formgrader) is a second layer behind this one.
* **Terminals and text files** (``reports/<a>.txt``, ``make check``, ``scripts/grade.py``):
  :func:`one_line` escapes every control and format character (newline, carriage return, the
  terminal's escape sequences, bidirectional overrides), so student text can neither add a
  line to a report nor hide one.
"""

from __future__ import annotations

import base64
import binascii
import re
import unicodedata

from course_utils.checks import SUBMIT_MIME, TRACE_MIME

_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t", "\x1b": "\\x1b"}


def one_line(text: object, limit: int | None = None) -> str:
    """``text`` as one line that shows everything it holds: control characters (C0, C1, DEL),
    format characters (bidirectional overrides, zero-width ones) and line/paragraph separators
    are written as escapes (``\\n``, ``\\x1b``, ``\\u202e``). A backslash stays as it is,
    so applying it twice changes nothing (a student's own ``\\n`` reads like an escaped line
    break, and is as harmless).
    ``limit``: at most that many characters of the result, then ``...``."""
    out = []
    for ch in str(text):
        if ch in _NAMED:
            out.append(_NAMED[ch])
        elif unicodedata.category(ch) in ("Cc", "Cf", "Zl", "Zp", "Cs", "Co", "Cn"):
            code = ord(ch)
            out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000
                       else f"\\U{code:08x}")
        else:
            out.append(ch)
    line = "".join(out)
    if limit is not None and len(line) > limit:
        line = line[:limit] + "..."
    return line


def lines(text: str) -> str:
    """Multi-line report text whose every line went through :func:`one_line` (the line breaks
    of ``text`` itself are kept: use it on text the grader assembled, never on student text)."""
    return "\n".join(one_line(line) for line in text.split("\n"))


# ------------------------------------------------------------------------------ pages

SAFE_IMAGES = ("image/png", "image/jpeg")
_GRADER_DATA = (SUBMIT_MIME, TRACE_MIME)
_BASE64 = re.compile(r"[A-Za-z0-9+/=\s]*\Z")
_SCHEMES = re.compile(r"(?i)\b(javascript|vbscript|livescript|mocha)(\s*):")
_TAG = re.compile(r"<[A-Za-z!/?]")


def is_base64(value: object) -> bool:
    """Is ``value`` base64 text (what a real PNG/JPEG output holds)?"""
    if not isinstance(value, str) or not _BASE64.match(value):
        return False
    try:
        base64.b64decode("".join(value.split()), validate=True)
    except (binascii.Error, ValueError):
        return False
    return True


def _note(removed: list[str]) -> str:
    return (f"[the grader removed {', '.join(removed)} from this output: student outputs are "
            f"shown as text and pictures only]")


def inert_output(output: dict) -> dict:
    """One output with nothing left that a browser would run (see the module doc)."""
    kind = output.get("output_type")
    if kind == "stream":
        return {"output_type": "stream", "name": "stdout" if output.get("name") != "stderr"
                else "stderr", "text": str(output.get("text", ""))}
    if kind == "error":
        trace = output.get("traceback", [])
        return {"output_type": "error", "ename": str(output.get("ename", "Error")),
                "evalue": str(output.get("evalue", "")),
                "traceback": [str(t) for t in trace] if isinstance(trace, list) else []}
    data = output.get("data", {}) if isinstance(output.get("data"), dict) else {}
    kept, removed = {}, []
    for mime, value in data.items():
        if mime in _GRADER_DATA:
            continue  # values for the grader (read before this runs), shown nowhere
        if mime == "text/plain" and isinstance(value, str):
            kept[mime] = value
        elif mime in SAFE_IMAGES and is_base64(value):
            kept[mime] = value
        else:
            removed.append(f"a {one_line(mime, 60)} part ({len(str(value)):,} characters)")
    if removed:
        note = _note(removed)
        kept["text/plain"] = f"{kept['text/plain']}\n{note}" if "text/plain" in kept else note
    out = {"output_type": kind if kind in ("display_data", "execute_result") else "display_data",
           "data": kept, "metadata": {}}
    if out["output_type"] == "execute_result":
        out["execution_count"] = output.get("execution_count")
    return out


_SCHEME_NOTE = "[the grader shows the HTML of this cell as text and breaks its script links]"


def inert_markdown(source: str) -> tuple[str, bool]:
    """A student's markdown with its HTML shown as text (``<`` and ``&`` escaped: a formula's
    ``a < b`` still reads as it was written) and its script link schemes broken;
    ``(text, whether it held HTML tags or such a link)``, the note added in that case."""
    text = source.replace("&", "&amp;").replace("<", "&lt;")
    text = _SCHEMES.sub(lambda m: f"{m.group(1)}{m.group(2)} :", text)
    active = bool(_TAG.search(source) or _SCHEMES.search(source))
    return (f"{text}\n\n{_SCHEME_NOTE}" if active else text), active


__all__ = ["SAFE_IMAGES", "inert_markdown", "inert_output", "is_base64", "lines",
           "one_line"]
