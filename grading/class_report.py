"""The class report of one assignment: how the class did, question by question.

:func:`summarize` reads the verified results (``grading.report.verify_assignment``) and gives:

* the **score distribution** (a histogram: :func:`figure_png`),
* per question (test cell), the share of the graded students who got it right and the share who
  made each **named misconception**: the judge's message with the student's own value left out
  (``q1_state_gb = 209.3 GB: that is GiB ...`` -> ``that is GiB ...``) and numbers that differ
  between students' variants masked for grouping (the message shown is one student's);
  a value that is no known mistake counts as "wrong, no named mistake", a test the answer's own
  error stopped as "the answer raised <Error>", an unanswered cell as "not answered",
* the **flags** (tampering, helpers used, answers right for a classmate's numbers, an identity
  typed), grouped across students with the students named,
* the **slowest submissions** (seconds their notebook took to run and be judged, from the judge
  logs) with the grading limits that fired.

:func:`render_text` is the head of ``reports/<assignment>.txt``; :func:`render_html` the page
``reports/<assignment>.html`` (the figure inline: one self-contained file to open). Everything a
student wrote or caused (messages, flags) is escaped on the page.
"""

from __future__ import annotations

import base64
import html
import io
import re
from dataclasses import dataclass, field

SHOWN = 8  # students named per line at most


@dataclass
class Mistake:
    """One named misconception (or kind of failure) of one question."""

    key: str            # what groups it: the message with the value and variant numbers masked
    text: str           # one student's message, as shown
    students: list[str] = field(default_factory=list)
    named: bool = True  # a misconception the judge names (not "wrong, no named mistake")


@dataclass
class Question:
    """How the graded students did on one test cell."""

    grade_id: str
    max_score: float
    graded: int = 0
    right: int = 0
    mistakes: list[Mistake] = field(default_factory=list)


@dataclass
class ClassSummary:
    """Everything the class report shows (see the module doc)."""

    assignment: str
    students: int
    graded: list[tuple[str, float]]          # (student, score), graded students only
    max_score: float
    not_graded: list[tuple[str, str]]        # (student, why)
    questions: list[Question]
    flags: list[tuple[str, list[str]]]       # (flag, students), most frequent first
    slowest: list[tuple[str, float, list[str]]]  # (student, seconds, limits)


_VALUE = re.compile(r"^(?P<name>[A-Za-z_][\w.]*(?:\[\d+\])?(?:\([^)]*\))?) = (?P<value>.+?)"
                    r"(?:(?P<plain> is not right[.:]?(?: |$))|(?P<named>: ))(?P<rest>.*)$", re.S)
_ERROR = re.compile(r"^(?P<ename>[A-Z][A-Za-z0-9_]*(?:Error|Exception|Interrupt|Exit|Limit))"
                    r"(?::\s*(?P<evalue>.*))?$", re.S)
_NUMBER = re.compile(r"(?<![A-Za-z_\d.])[-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?")
_CASE = re.compile(r"hidden case \d+")


def _mask(text: str) -> str:
    """Numbers masked (they differ between students' variants) for grouping."""
    return _NUMBER.sub("#", _CASE.sub("hidden case #", text.strip()))


def misconception(message: str) -> tuple[str, str, bool]:
    """``(key, text, named)`` of a failed cell's message: ``key`` groups the students who made
    the same mistake, ``text`` says it, ``named``: whether the judge named a misconception."""
    message = (message or "no message").strip()
    first = message.splitlines()[0] if message else message
    if first.startswith("not answered"):
        return "not answered", "not answered (the cell still raises NotImplementedError)", False
    m = _VALUE.match(first)
    if m:
        name, rest = m.group("name"), m.group("rest").strip()
        if m.group("named") and rest:
            return f"{name}: {_mask(rest)}", f"{name}: {rest}", True
        return f"{name}: wrong", f"{name}: wrong, no named mistake", False
    e = _ERROR.match(first)
    if e:
        ename = e.group("ename")
        if ename == "NotImplementedError":
            return "not answered", "not answered (the cell still raises NotImplementedError)", False
        if ename == "GradingLimit":
            return (f"limit: {_mask(e.group('evalue') or '')}",
                    f"stopped by a grading limit: {e.group('evalue') or ''}", False)
        if ename == "CellTimeoutError":
            return "timeout", "ran past the cell's time limit", False
        return f"raised {ename}", f"the answer raised {ename}", False
    if first.startswith("the test stopped before submitting"):
        return _mask(first), first, False
    return _mask(first), first, True


_FLAG_KINDS = [  # (pattern, replacement): what makes two students' flags the same kind
    (re.compile(r" \(cells [^)]*\)$"), ""),
    (re.compile(r"^(?:(?:line \d+|\w+_test(?:, \w+_test)*): |cell \S+?(?:, |: ))"), ""),
    (re.compile(r"\(by chance: 1 in [\d,]+; "), "("),
    (re.compile(r"^test cell \S+ was"), "a test cell was"),
    (re.compile(r"uses course_utils\.[\w.]+(?: \(through a computed name\))?, which"),
     "uses a course helper, which"),
    (re.compile(r"^(defines|assigns to|rebinds) \S+ \("), r"\1 ... ("),
    (re.compile(r"^class \S+ subclasses"), "a class subclasses"),
]


def _condensed_flag(flag: str, student: str, everyone: set[str]) -> str:
    """The kind of a flag, for grouping students: cells, lines, questions, names and the
    student's own and classmates' ids left out (the report's per-student part has them)."""
    text = flag
    for pattern, repl in _FLAG_KINDS:
        text = pattern.sub(repl, text)
    words = re.split(r"(\W)", text)
    text = "".join("the student" if w == student else "a classmate" if w in everyone else w
                   for w in words)
    # "the numbers of a classmate, a classmate and 3 more" -> "classmates"
    return re.sub(r"a classmate(?:(?:, | and )(?:a classmate|\d+ more))+", "classmates", text)


def summarize(assignment: str, results: list) -> ClassSummary:
    """The class report's content from ``report.verify_assignment``'s results."""
    from grading.verify import condense

    graded = [r for r in results if r.graded]
    everyone = {r.student for r in results}
    questions: dict[str, Question] = {}
    for r in graded:
        for c in r.cells:
            q = questions.setdefault(c.grade_id, Question(c.grade_id, c.max_score))
            q.graded += 1
            if c.score >= c.max_score:
                q.right += 1
                continue
            key, text, named = misconception(c.message)
            for mistake in q.mistakes:
                if mistake.key == key:
                    mistake.students.append(r.student)
                    break
            else:
                q.mistakes.append(Mistake(key, text, [r.student], named))
    for q in questions.values():
        q.mistakes.sort(key=lambda m: (-len(m.students), not m.named, m.key))
    flags: dict[str, list[str]] = {}
    for r in results:
        for flag in condense(r.flags):
            group = flags.setdefault(_condensed_flag(flag, r.student, everyone), [])
            if r.student not in group:
                group.append(r.student)
    slowest = sorted(((r.student, r.seconds, r.limits) for r in graded if r.seconds is not None),
                     key=lambda t: -t[1])[:5]
    return ClassSummary(
        assignment, len(results), [(r.student, r.score) for r in graded],
        max((r.max_score for r in graded), default=0.0),
        [(r.student, r.status.split(": ", 1)[-1]) for r in results if not r.graded],
        list(questions.values()), sorted(flags.items(), key=lambda kv: (-len(kv[1]), kv[0])),
        slowest)


def _pct(n: int, of: int) -> str:
    return f"{100 * n / of:.0f} %" if of else "-"


def _points(n: float) -> str:
    return f"{n:g} point" + ("" if n == 1 else "s")


def _names(students: list[str]) -> str:
    shown = ", ".join(students[:SHOWN])
    return shown + (f" and {len(students) - SHOWN} more" if len(students) > SHOWN else "")


def _histogram(summary: ClassSummary) -> list[tuple[float, int]]:
    """(score, students) for every score from 0 to the maximum reached or possible."""
    scores = [s for _, s in summary.graded]
    top = int(max([summary.max_score, *scores], default=0))
    counts = {float(k): 0 for k in range(top + 1)}
    for s in scores:
        counts[float(int(s))] = counts.get(float(int(s)), 0) + 1
    return sorted(counts.items())


def render_text(summary: ClassSummary) -> str:
    """The class summary as plain text (the head of ``reports/<assignment>.txt``)."""
    s = summary
    lines = [f"CLASS SUMMARY: {s.students} students, {len(s.graded)} graded, "
             f"{len(s.not_graded)} NOT graded"]
    if s.graded:
        scores = sorted(x for _, x in s.graded)
        mid = len(scores) // 2
        median = scores[mid] if len(scores) % 2 else (scores[mid - 1] + scores[mid]) / 2
        full = _pct(scores.count(s.max_score), len(scores))
        lines.append(f"score out of {s.max_score:g}: mean {sum(scores) / len(scores):.1f}, "
                     f"median {median:g}, full marks {full}")
        width = max(n for _, n in _histogram(s)) or 1
        for score, n in (row for row in _histogram(s) if row[1]):
            lines.append(f"  {score:>4g} | {'#' * round(30 * n / width):<30s} {n}")
    lines.append("")
    lines.append("per question, share of the graded students:")
    for q in s.questions:
        lines.append(f"  {q.grade_id} ({_points(q.max_score)}): {_pct(q.right, q.graded)} right")
        for m in q.mistakes:
            lines.append(f"    {_pct(len(m.students), q.graded):>5s}  {_clip(m.text, 160)}"
                         f"  [{_names(m.students)}]")
    if s.flags:
        lines.append("")
        lines.append("flags (evidence to look at, never a score):")
        for text, students in s.flags:
            lines.append(f"  {len(students):>3d} x {_clip(text, 160)}  [{_names(students)}]")
    if s.slowest:
        lines.append("")
        lines.append("slowest submissions (seconds to run and judge):")
        for student, seconds, limits in s.slowest:
            lines.append(f"  {seconds:7.1f} s  {student}"
                         + (f"  (LIMIT {_clip('; '.join(limits), 120)})" if limits else ""))
    if s.not_graded:
        lines.append("")
        lines.append("not graded:")
        for student, why in s.not_graded:
            lines.append(f"  {student}: {_clip(why, 300)}")
    from grading.inert import lines as inert_lines

    return inert_lines("\n".join(lines)) + "\n"


def _clip(text: str, most: int) -> str:
    """``text`` cut to at most ``most`` characters at a word's end, with " ..." when cut."""
    if len(text) <= most:
        return text
    head = text[:most - 4]
    return (head.rsplit(" ", 1)[0] if " " in head else head) + " ..."


def figure_png(summary: ClassSummary) -> bytes:
    """The score distribution as a PNG (bars: students per score; the mean marked)."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.4, 3.2), dpi=100)
    ax = fig.add_subplot()
    hist = _histogram(summary)
    ax.bar([x for x, _ in hist], [n for _, n in hist], width=0.8, color="#4c72b0")
    scores = [x for _, x in summary.graded]
    title = f"{summary.assignment}: {len(scores)} graded students"
    if scores:
        mean = sum(scores) / len(scores)
        ax.axvline(mean, color="#dd8452", linestyle="--")
        title += f", mean {mean:.1f} (dashed)"
    ax.set_xlabel(f"autograded score (out of {summary.max_score:g})")
    ax.set_ylabel("students")
    ax.set_title(title, fontsize=10)
    ax.yaxis.get_major_locator().set_params(integer=True)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"


def render_html(summary: ClassSummary, results: list, isolation: str = "") -> str:
    """The class report as one self-contained page (the figure inline), then every student."""
    from grading.verify import condense

    s, e = summary, html.escape
    png = base64.b64encode(figure_png(s)).decode()
    # (no script may run in this page, whatever a student's text holds: the policy forbids it)
    out = [f"<!doctype html><html><head><meta charset='utf-8'><meta http-equiv='Content-"
           f"Security-Policy' content=\"{CSP}\"><title>{e(s.assignment)}: class "
           "report</title><style>body{font-family:sans-serif;max-width:60em;margin:2em auto;"
           "padding:0 1em}table{border-collapse:collapse}td,th{border-bottom:1px solid #ddd;"
           "padding:.2em .6em;text-align:left;vertical-align:top;overflow-wrap:break-word}"
           # (a student id or a header whole on its line: "anywhere" let the table squeeze
           # columns until ids broke letter by letter, "am / arti / n")
           "th,.id,.share{white-space:nowrap}"
           ".bar{background:#dd8452;"
           "height:.8em;display:inline-block}.who{color:#555;font-size:90%}</style></head><body>",
           f"<h1>{e(s.assignment)}: class report</h1>",
           f"<p>{s.students} students: {len(s.graded)} graded, {len(s.not_graded)} not graded"
           + (f". Grading kernels: {e(isolation)}" if isolation else "") + ".</p>",
           f"<img alt='score distribution' src='data:image/png;base64,{png}'>",
           "<h2>Per question</h2><p>Share of the graded students who got each question right, "
           "and who made each mistake the judge named.</p>"]
    for q in s.questions:
        out.append(f"<h3>{e(q.grade_id)} ({_points(q.max_score)}): {_pct(q.right, q.graded)} "
                   "right</h3>")
        if q.mistakes:
            out.append("<table><tr><th>share</th><th>mistake</th><th>students</th></tr>")
            for m in q.mistakes:
                share = len(m.students) / q.graded if q.graded else 0
                out.append(f"<tr><td class='share'>{_pct(len(m.students), q.graded)} "
                           f"<span class='bar' style='width:{round(6 * share, 2)}em'></span></td>"
                           f"<td>{e(m.text)}</td><td class='who'>{e(_names(m.students))}</td>"
                           "</tr>")
            out.append("</table>")
    if s.flags:
        out.append("<h2>Flags</h2><p>Evidence to look at, never a score.</p><table>"
                   "<tr><th>students</th><th>flag</th><th>who</th></tr>")
        for text, students in s.flags:
            out.append(f"<tr><td>{len(students)}</td><td>{e(text)}</td>"
                       f"<td class='who'>{e(_names(students))}</td></tr>")
        out.append("</table>")
    if s.slowest:
        out.append("<h2>Slowest submissions</h2><table><tr><th>seconds</th><th>student</th>"
                   "<th>limits that fired</th></tr>")
        for student, seconds, limits in s.slowest:
            out.append(f"<tr><td>{seconds:.1f}</td><td class='id'>{e(student)}</td>"
                       f"<td>{e('; '.join(limits))}</td></tr>")
        out.append("</table>")
    out.append("<h2>Every student</h2><table><tr><th>student</th><th>score</th>"
               "<th>failed</th><th>flags</th></tr>")
    for r in results:
        score = f"{r.score:g} / {r.max_score:g}" if r.graded else \
            f"NOT GRADED: {r.status.split(': ', 1)[-1]}"
        failed = "<br>".join(f"{e(c.grade_id)}: {e(c.message)}" for c in r.failed_cells)
        out.append(f"<tr><td class='id'>{e(r.student)}</td><td>{e(score)}</td><td>{failed}</td>"
                   f"<td>{'<br>'.join(e(f) for f in condense(r.flags))}</td></tr>")
    out.append("</table></body></html>")
    return "\n".join(out)


__all__ = ["ClassSummary", "Mistake", "Question", "figure_png", "misconception", "render_html",
           "render_text", "summarize"]
