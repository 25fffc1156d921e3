"""The class report page in Chromium at a laptop's width (issue 36): with 30 students, no student
id and no column header breaks across lines, the figure shows under the page's script-free
policy, and long mistakes still wrap inside the page."""

from __future__ import annotations

import pytest

from grading import class_report
from grading.integrity import CellResult, StudentResult
from jupyterlab_harness import chromium

MESSAGE = ("q1_state_gb = 193.715 GB: that is GiB (2**30 bytes); the question asks for GB "
           "(10**9 bytes), and the 16 bytes per parameter of the lesson's table are all counted")


def _class(n: int = 30) -> list[StudentResult]:
    out = []
    for i in range(n):
        sid = ["amartin", "s-2026-0123", "zhang.wei", "o'connor", "student42"][i % 5] + f"{i}"
        cells = [CellResult(f"q{k}_test", 2, 0 if (i + k) % 3 else 2, 0 if (i + k) % 3 else 2,
                            MESSAGE if (i + k) % 3 else "") for k in range(1, 5)]
        flags = [f"q1_state_gb_test, q3_test: the answers are what the numbers of amartin0, "
                 f"s-2026-01231 and 4 more with the same numbers give (right, or a mistake the "
                 f"judge knows for them), not {sid}'s own (by chance: 1 in 2,580; evidence of "
                 f"a copied answer, not a score: docs/instructor.md)",
                 "calls get_ipython() (cells q1, q2)"] if i % 2 else []
        r = StudentResult(sid, "graded", cells=cells, seconds=1.0 + i, flags=flags)
        r.max_score = 8
        r.score = r.kernel_score = sum(c.score for c in cells)
        out.append(r)
    out.append(StudentResult("share_the_longest_id_of_all", "not graded: notebook missing"))
    return out


@pytest.mark.browser
def test_the_class_report_reads_on_a_laptop(tmp_path):
    results = _class()
    page_file = tmp_path / "a1_training_state.html"
    page_file.write_text(class_report.render_html(
        class_report.summarize("a1_training_state", results), results, "sandboxed"))
    with chromium() as browser:
        page = browser.new_page(viewport={"width": 1280, "height": 800})
        page.goto(page_file.as_uri())
        page.wait_for_load_state("load")
        broken = page.evaluate("""() => {
            // the line boxes of the text itself (a cell is as tall as its row)
            const out = [];
            for (const el of document.querySelectorAll('th, td.id')) {
                const range = document.createRange();
                range.selectNodeContents(el);
                const tops = new Set(Array.from(range.getClientRects(),
                                                r => Math.round(r.top)));
                if (tops.size > 1) out.push(el.textContent);
            }
            return out;
        }""")
        figure = page.evaluate("() => document.querySelector('img').naturalWidth")
        wide = page.evaluate("() => document.documentElement.scrollWidth")
    assert broken == [], f"wrapped across lines: {broken[:5]}"
    assert figure > 0  # the figure shows under the Content-Security-Policy
    assert wide <= 1280  # and long mistakes wrap inside the page
