"""The class report (grading/class_report.py): shares of each named misconception per question,
flags grouped across students, the slowest submissions, the score figure, and a page that shows
whatever a student's code wrote as text, never as markup. (Its text on a real synthetic class is
checked where a class is graded: tests/test_slurm.py.)"""

from __future__ import annotations

import html.parser

from grading import class_report
from grading.integrity import CellResult, StudentResult


def _student(name, cells, flags=(), seconds=1.0, limits=()):
    r = StudentResult(name, "graded", cells=[CellResult(g, m, s, s, msg) for g, m, s, msg in cells],
                      flags=list(flags), seconds=seconds, limits=list(limits))
    r.max_score = sum(c.max_score for c in r.cells)
    r.score = r.kernel_score = sum(c.score for c in r.cells)
    return r


GIB = "q1_state_gb = {}: that is GiB (2**30 bytes); the question asks for GB (10**9 bytes)."
SUM = "w_new_0 = {}: you used the SUM of the gradients [{}]: divide by D = {}"


def _class():
    return [
        _student("ann", [("q1_test", 2, 2, ""), ("q2_test", 1, 1, "")], seconds=2.0),
        _student("bob", [("q1_test", 2, 0, GIB.format("223.5 GB")),
                         ("q2_test", 1, 0, SUM.format(0.2, "1, 3", 3))], seconds=9.5,
                 limits=["cell 4: ran past the cell's time limit"]),
        _student("cat", [("q1_test", 2, 0, GIB.format("521.5 GB")),
                         ("q2_test", 1, 0, SUM.format(0.7, "2.5, 4", 5))],
                 flags=["q1_test, q2_test: the answers are what the numbers of ann give, not "
                        "cat's own (by chance: 1 in 120; evidence of a copied answer)"]),
        _student("dan", [("q1_test", 2, 0, "q1_state_gb = 7 GB is not right."),
                         ("q2_test", 1, 0, "NotImplementedError: ")],
                 flags=["cell q1, line 2: assigns to math.isclose",
                        "cell q2, line 1: assigns to math.isclose"]),
        _student("eve", [("q1_test", 2, 0, "RuntimeError: <script>alert(1)</script>"),
                         ("q2_test", 1, 1, "")],
                 flags=["q2_test, q3_test: the answers are what the numbers of ann give, not "
                        "eve's own (by chance: 1 in 64; evidence of a copied answer)",
                        "line 1: assigns to math.isclose",
                        "cell q1: nbgrader metadata edited (cell_type, checksum)",
                        "cell cell-04: nbgrader metadata edited (cell_type, checksum)"]),
        StudentResult("fay", "not graded: its Slurm task: job 7_5 ended TIMEOUT"),
    ]


def test_each_named_mistake_gets_its_share_of_the_graded_students():
    s = class_report.summarize("a1_training_state", _class())
    assert s.students == 6 and len(s.graded) == 5 and s.max_score == 3
    assert s.not_graded == [("fay", "its Slurm task: job 7_5 ended TIMEOUT")]
    q1, q2 = s.questions
    assert (q1.grade_id, q1.graded, q1.right) == ("q1_test", 5, 1)
    # two students with different values made the same named mistake: one line, 40 %
    gib = q1.mistakes[0]
    assert gib.students == ["bob", "cat"] and gib.named
    assert gib.text == ("q1_state_gb: that is GiB (2**30 bytes); the question asks for GB "
                        "(10**9 bytes).")
    assert [(m.text, m.students) for m in q1.mistakes[1:]] == [
        ("q1_state_gb: wrong, no named mistake", ["dan"]),
        ("the answer raised RuntimeError", ["eve"])]
    # the numbers of each student's own variant do not split a misconception
    assert q2.mistakes[0].students == ["bob", "cat"]
    assert q2.mistakes[1].text.startswith("not answered")
    text = class_report.render_text(s)
    assert "q1_test (2 points): 20 % right" in text
    assert "   40 %  q1_state_gb: that is GiB (2**30 bytes)" in text
    assert "q2_test (1 point): 40 % right" in text


def test_flags_are_grouped_across_students_and_the_slowest_listed():
    s = class_report.summarize("a1_training_state", _class())
    flags = dict(s.flags)
    assert flags["assigns to math.isclose"] == ["dan", "eve"]
    # a flag naming its cell ("cell q1: ...", a comma inside the message) keeps its whole text
    assert flags["nbgrader metadata edited (cell_type, checksum)"] == ["eve"]
    # the same kind of flag on different questions, with different names in it: one line
    copied = ("the answers are what the numbers of a classmate give, not the student's own "
              "(evidence of a copied answer)")
    assert flags[copied] == ["cat", "eve"]
    assert [x[0] for x in s.slowest[:2]] == ["bob", "ann"]
    text = class_report.render_text(s)
    assert "  2 x assigns to math.isclose  [dan, eve]" in text
    assert "9.5 s  bob  (LIMIT cell 4: ran past the cell's time limit)" in text
    assert "fay: its Slurm task: job 7_5 ended TIMEOUT" in text


class _Page(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags, self.images, self.text = [], [], []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        if tag == "img":
            self.images.append(dict(attrs)["src"])

    def handle_data(self, data):
        self.text.append(data)


def test_the_page_holds_the_figure_and_shows_student_text_as_text():
    import base64

    results = _class()
    s = class_report.summarize("a1_training_state", results)
    page = _Page()
    page.feed(class_report.render_html(s, results, "sandboxed"))
    assert "script" not in page.tags  # a student's error message is text on the page
    assert any("<script>alert(1)</script>" in t for t in page.text)
    [src] = page.images
    assert src.startswith("data:image/png;base64,")
    png = base64.b64decode(src.split(",", 1)[1])
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
    shown = " ".join(page.text)
    assert "20 %" in shown and "NOT GRADED: its Slurm task: job 7_5 ended TIMEOUT" in shown
    # and no script could run in it anyway: the page forbids every script (issue 41)
    assert f"content=\"{class_report.CSP}\"" in class_report.render_html(s, results)
    assert "script-src" not in class_report.CSP and "default-src 'none'" in class_report.CSP


def test_messages_are_read_for_their_misconception():
    m = class_report.misconception
    assert m("max_params(40, 16) = 75 is not right: 40 GB at 16 bytes each.")[1] == \
        "max_params(40, 16): wrong, no named mistake"
    assert m("zero2_gb = 4 GB: that is ZeRO-3")[1:] == ("zero2_gb: that is ZeRO-3", True)
    assert m("the test stopped before submitting 'x'")[1] == \
        "the test stopped before submitting 'x'"
    assert m("GradingLimit: the memory limit stopped this cell")[1].startswith(
        "stopped by a grading limit")
    assert m("hidden case 2: rank 1 returned 3")[0] == m("hidden case 3: rank 0 returned 9")[0]


def test_a_long_line_is_cut_at_a_word_with_an_ellipsis_and_a_share_stays_on_its_line():
    """Issue 50, finding 14: the text report cut a message mid-word with no sign of it; the
    page's share column wrapped its bar onto a second line."""
    words = "the restart is lost at every failure too: add R over M to the lost time " * 6
    results = [_student("ann", [("q1_test", 2, 0, words)]),
               _student("bob", [("q1_test", 2, 0, words)])]
    s = class_report.summarize("a1_training_state", results)
    [line] = [x for x in class_report.render_text(s).splitlines() if "restart is lost" in x]
    shown = line.split("%  ", 1)[1].rsplit("  [", 1)[0]
    assert shown.endswith(" ...") and words.startswith(shown[:-4]) and len(shown) <= 160
    assert words[len(shown) - 4] == " "  # (cut where a word ends)
    page = class_report.render_html(s, results)
    assert "<td class='share'>" in page and ".share{white-space:nowrap}" in page.replace(
        "th,.id,", "")
