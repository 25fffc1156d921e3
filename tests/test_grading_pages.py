"""Every page a person reads renders student content inert and still reads as a page (issues
41, 50, 51), at the value level: the rendered, decoded HTML of a markdown cell is kept to an
allowlist whatever the markdown's spelling; what a page renders of a student's cells is
bounded; prompts are numbers; a dropped attachment takes its reference with it. The same
pages opened in Chromium: ``tests/test_grading_host.py``."""

from __future__ import annotations

import html.parser
from urllib.parse import urljoin

import nbformat
import pytest
from traitlets.config.loader import PyFileConfigLoader

from conftest import ROOT
from grading import filters, inert

A = "a1_training_state"
JS = "alert(1)"

# Each spelling of a link that runs script, or loads a page from data (issue 51, finding 3:
# the first three got through the regular expression on the raw markdown; the fourth was
# "broken" by a pattern that did not list it; the fifth became javascript: after
# nbconvert's strip_files_prefix ran on the checked HTML).
SCRIPT_LINKS = [f"[a](javascript\\:{JS})", f"[a](jav&#x61;script:{JS})",
                f"[a][r]\n\n[r]: javascript&#58;{JS}", "[a](data:text/html,x)",
                f"[a](files/javascript:{JS})", f"[a](JaVaScRiPt:{JS})",
                f"[a](java\tscript:{JS})", f"[a](&#106;avascript:{JS})",
                f"[a](vbscript:{JS})", f"[a](%6Aavascript:{JS})", f"[a](<javascript:{JS}>)",
                f"<javascript:{JS}>", f"[a](  javascript:{JS})", "[a](data:image/png;base64,AA)",
                f"![a](javascript:{JS})", "![a](https://example.org/x.png)",
                "![a](../../api/logout)", f"[a](\\\\\\\\evil\\javascript:{JS})"]
KEPT_LINKS = {"[a](https://example.org/x)": "https://example.org/x",
              "[a](http://example.org)": "http://example.org",
              "[a](mailto:ta@example.org)": "mailto:ta@example.org",
              "[a](../a2_data_parallel/a2.ipynb)": "../a2_data_parallel/a2.ipynb",
              "[a](#Q1)": "#Q1", "<https://example.org>": "https://example.org"}


@pytest.fixture(scope="module")
def exporter():
    """An HTMLExporter configured as every page of the course is (nbgrader_config.py)."""
    from nbconvert.exporters import HTMLExporter

    return HTMLExporter(config=PyFileConfigLoader("nbgrader_config.py",
                                                  path=str(ROOT)).load_config())


class _Links(html.parser.HTMLParser):
    """Every URL a browser would act on in a page: hrefs, srcs, actions, entities decoded."""

    def __init__(self):
        super().__init__()
        self.urls: list[tuple[str, str, str]] = []
        self.tags: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self.urls += [(tag, k, v or "") for k, v in attrs
                      if k in ("href", "src", "action", "formaction", "srcdoc", "xlink:href")]


def _page(exporter, *cells, resources=None) -> str:
    nb = nbformat.v4.new_notebook()
    nb.cells = list(cells)
    out, _ = exporter.from_notebook_node(nb, resources=resources or {})
    return out


def _cell_links(exporter, markdown: str) -> list[tuple[str, str, str]]:
    page = _page(exporter, nbformat.v4.new_markdown_cell(f"Zebra {markdown}"))
    body = page[page.index("Zebra"):]
    parser = _Links()
    parser.feed(body)
    return [u for u in parser.urls if u[2] != "#"]


@pytest.mark.parametrize("markdown", SCRIPT_LINKS)
def test_no_link_that_runs_script_survives_the_rendered_page(exporter, markdown):
    """Finding 3: whatever the spelling, the page (configured as nbgrader_config.py configures
    the formgrader and feedback) holds no URL outside http, https, mailto and relative links,
    and no picture but base64 data; the words stay."""
    for tag, attr, url in _cell_links(exporter, markdown):
        if tag == "img":
            assert url.startswith("data:image/"), (markdown, url)
        else:  # (where a browser on the formgrader's page would go)
            assert inert.safe_url(url), (markdown, url)
            scheme = urljoin("http://localhost:8888/formgrader/submissions/1/", url)
            assert scheme.split(":")[0] in ("http", "https", "mailto"), (markdown, url)


@pytest.mark.parametrize("markdown, url", KEPT_LINKS.items())
def test_an_honest_link_is_kept(exporter, markdown, url):
    assert ("a", "href", url) in _cell_links(exporter, markdown)


def test_safe_url_reads_a_url_as_a_browser_does():
    for url in ("javascript:x", " javascript:x", "java\nscript:x", "JAVASCRIPT:x",
                "\x01javascript:x", "vbscript:x", "data:text/html,x", "blob:x", "file:///etc",
                "jav\u200bascript:x", "a:b/c"):
        assert not inert.safe_url(url), url
    for url in ("https://x.org/a:b", "a/b:c", "#x", "?a=b:c", "mailto:a@b.c", "", "./x"):
        assert inert.safe_url(url), url
    assert inert.safe_url("data:image/png;base64,AAAA", image=True)
    assert not inert.safe_url("data:image/svg+xml;base64,AAAA", image=True)
    assert not inert.safe_url("https://x.org/a.png", image=True)


def test_the_course_text_renders_as_a_page_and_nothing_it_says_is_lost(exporter):
    """Issue 50, finding 1: a heading is an ``<h1>`` with its words (nbconvert's sanitizer
    showed it as the literal tag), and every element and attribute the course's own markdown
    renders to is on the allowlist: each release notebook's page keeps every tag it had."""
    page = _page(exporter, nbformat.v4.new_markdown_cell("# Zebratitle\n\nA *b* $x<y$.\n\n"
                                                         "| a | b |\n|:-|-:|\n| 1 | 2 |"))
    assert '<h1 id="Zebratitle">Zebratitle' in page and "&lt;h1" not in page
    assert "<em>b</em>" in page and '<th style="text-align:left;">' in page
    # math drawn by the browser from MathML made here: no script, no network (issue 50: the
    # pages loaded MathJax from a CDN, which an offline machine cannot reach)
    assert '<math display="inline"' in page.replace(' xmlns="http://www.w3.org/1998/Math/MathML"',
                                                    "") and "<mo>&lt;</mo>" in page
    from nbconvert.filters.markdown_mistune import MarkdownWithMath

    for path in sorted((ROOT / "assignments").glob("*/*.ipynb")):
        for cell in nbformat.read(path, as_version=4).cells:
            if cell.cell_type != "markdown":
                continue
            raw = MarkdownWithMath(renderer=inert._math_renderer()(
                escape=False, anchor_link_text="\u00b6")).render(cell.source)
            before, after = _Links(), _Links()
            before.feed(raw)
            after.feed(inert.safe_html(raw))
            assert after.tags == before.tags and after.urls == before.urls, path


def test_a_page_bounds_what_it_renders_of_a_student(exporter):
    """Finding 6: a student's cells are rendered up to a budget per page and shown as plain
    text past it (nothing lost, linear time); the course's cells always render."""
    release = nbformat.read(ROOT / "assignments" / A / f"{A}.ipynb", as_version=4)
    nb = nbformat.from_dict(release)
    nb.cells += [nbformat.v4.new_markdown_cell("[" * 200_000),
                 nbformat.v4.new_markdown_cell("# Short answer"),
                 nbformat.v4.new_code_cell("x = a" + ".b" * 50_000)]
    out, _ = filters.BoundPageText().preprocess(nbformat.from_dict(nb), {
        "assignment_id": A, "notebook_id": A})
    marks = [c.metadata.get(inert.PLAIN) for c in out.cells]
    assert all(m is None for m in marks[:len(release.cells)])
    assert marks[-3] and marks[-2] is None and marks[-1]
    assert len(out.cells[-3].source) < 101_000 and "more characters cut" in out.cells[-3].source
    page = _page(exporter, *nb.cells[-3:])
    assert "[[[[" in page and "<h1" in page
    forged = nbformat.v4.new_markdown_cell("x")
    forged.metadata[inert.PLAIN] = "a student's own mark"
    out, _ = filters.BoundPageText().preprocess(nbformat.from_dict({**nb, "cells": [forged]}),
                                                {})
    assert inert.PLAIN not in out.cells[0].metadata


def test_a_prompt_is_a_number_and_a_dropped_attachment_takes_its_reference(exporter):
    """Findings 4 and 5: a prompt the kernel forged is no prompt; a GIF dragged into an answer
    is dropped with its reference (nbconvert stopped the whole feedback run on it)."""
    code = nbformat.v4.new_code_cell("1")
    code.execution_count = "<img src=x onerror=alert(1)>"
    code.outputs = [nbformat.from_dict({"output_type": "execute_result", "data": {
        "text/plain": "1"}, "metadata": {}, "execution_count": "<b>1</b>"})]
    gif = nbformat.v4.new_markdown_cell("see ![moving](attachment:moving.gif) and "
                                        "![kept](attachment:kept.png)")
    gif["attachments"] = {"moving.gif": {"image/gif": "R0lGODlh"},
                          "kept.png": {"image/png": "iVBORw0KGgo="}}
    nb = nbformat.v4.new_notebook()
    nb.cells = [code, gif]
    out, _ = filters.InertStudentContent().preprocess(nb, {})
    assert out.cells[0].execution_count is None
    assert out.cells[0].outputs[0].execution_count is None
    assert out.cells[1].source == ("see ![moving](removed-attachment) and "
                                   "![kept](attachment:kept.png)")
    assert set(out.cells[1].attachments) == {"kept.png"}
    nbformat.validate(out)
    page = _page(exporter, code, gif)  # (the exporter makes the notebook inert itself too)
    assert "onerror" not in page and "<b>1</b>" not in page
    assert 'src="data:image/png;base64,iVBORw0KGgo="' in page


def test_a_cell_that_cannot_render_shows_as_text():
    """A page's markdown filter never stops a page: a cell nbconvert cannot render (here an
    attachment that is not there, which a page's own preprocessor would have removed) is
    shown as its text."""
    shown = inert._markdown2html({"cell": {"attachments": {}}},
                                 "![x](attachment:missing.png) <b>")
    assert "not rendered" in shown and "attachment:missing.png" in shown
    assert "<b>" not in shown


def test_kept_objects_are_counted_at_their_cost():
    """Finding 7: 490,000 empty objects cost about 31 MB to keep, not 0.5 MB."""
    from grading.preprocessors import CONTAINER_BYTES, payload_size

    content = {"data": {"application/json": [{} for _ in range(490_000)]}}
    assert payload_size(content, 64) >= 490_000 * CONTAINER_BYTES
    assert payload_size({"text": "x" * 1000}, 64) < 1200
