"""The leak scanner: does a file published to students hold any answer, hidden test or judge value?

Used by ``tests/test_student_copy.py`` (the students' copy) and ``tests/test_site.py`` (the
course website). :func:`secrets` collects what must never be published, :func:`lines` reads a
file (a notebook's sources and text outputs, an HTML page's text and code blocks) as stripped
lines, and :func:`leaks` names what of the first appears in the second.
"""

from __future__ import annotations

import html
import re
from pathlib import Path

import nbformat

from grading import names

ROOT = Path(__file__).resolve().parent.parent
MARKERS = ("BEGIN SOLUTION", "BEGIN HIDDEN TESTS")
# Programs handed to students to fix (a10 part 2): a fix repeats most of its program's lines, and
# those lines are published on purpose; only what a fix changes is secret.
GIVEN = [names.source_file("pitfalls")]


def assignments() -> list[str]:
    """The course's assignments, one per source in ``authoring/assignments/``."""
    return sorted(p.stem for p in (ROOT / "authoring" / "assignments").glob("*.py"))


def regions(assignment: str) -> list[list[str]]:
    """The stripped, non-blank lines of each solution and hidden-test region of a solution."""
    nb = nbformat.read(ROOT / "solutions" / assignment / f"{assignment}.ipynb", as_version=4)
    found, current = [], None
    for cell in nb.cells:
        for line in cell.source.splitlines():
            tag = line.strip()
            if tag in ("### BEGIN HIDDEN TESTS", "### BEGIN SOLUTION"):
                current = []
            elif tag in ("### END HIDDEN TESTS", "### END SOLUTION"):
                found.append(current)
                current = None
            elif current is not None and tag:
                current.append(tag)
    return found


def secrets() -> tuple[set, set]:
    """Every run of 3 consecutive lines of answer, hidden-test or judge code, and every judge
    line with a value or a message in it (the expected values and known mistakes)."""
    windows, checks = set(), set()
    for a in assignments():
        visible = set(lines(ROOT / "assignments" / a / f"{a}.ipynb"))
        judge = [ln.strip() for ln in (ROOT / "authoring" / "judges" / f"{a}.py").read_text(
            encoding="utf-8").splitlines() if ln.strip()]
        for region in regions(a):
            windows |= set(zip(region, region[1:], region[2:]))
    for path in GIVEN:
        given = lines(path)
        windows -= set(zip(given, given[1:], given[2:]))
        # the judge's values and messages (its plain code may repeat the course's library)
        checks |= {ln for ln in judge if len(ln) > 20 and ln not in visible
                   and not ln.startswith(("import ", "from ", "#", '"""'))
                   and (re.search(r'"[^"]*\s[^"]*\s[^"]*"', ln)  # a message of words
                        or re.search(r"\d\.\d|\de\d", ln))}
    return windows, checks


def lines(path: Path) -> list[str]:
    """A file's stripped non-blank lines: a notebook's also as its cells' sources and text
    outputs, an HTML page's also as its text and its code blocks without their markup."""
    text = path.read_text(encoding="utf-8", errors="ignore")
    if path.suffix == ".ipynb":
        nb = nbformat.reads(text, as_version=4)
        text = "\n".join([text] + [c.source for c in nb.cells] + [
            str(o.get("text", "")) + str(o.get("data", {}).get("text/plain", ""))
            for c in nb.cells for o in c.get("outputs", [])])
    elif path.suffix in (".html", ".htm"):
        from bs4 import BeautifulSoup

        soup = BeautifulSoup(text, "html.parser")
        code = [pre.get_text() for pre in soup.find_all("pre")]  # highlighted code, line by line
        text = "\n".join([text, soup.get_text("\n"), *code])
        text += "\n" + html.unescape(text)
    return [ln.strip() for ln in text.splitlines() if ln.strip()]


def leaks(found_lines: list[str], windows: set, checks: set) -> list[str]:
    """What of :func:`secrets` (``windows``, ``checks``) and the nbgrader markers the lines hold."""
    text = "\n".join(found_lines)
    hits = [marker for marker in MARKERS if marker in text]
    return hits + sorted(checks & set(found_lines)) + sorted(
        " / ".join(w) for w in windows & set(zip(found_lines, found_lines[1:], found_lines[2:])))
