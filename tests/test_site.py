"""The course website (``make site``): built from the committed notebooks, read in Chromium.

Builds the site once into a temporary folder with ``scripts/build_site.py``, serves it from a
local ``http.server`` and opens every page in Debian's Chromium (Playwright): no console error
or failed request, no request leaving the local server, every image loaded, every internal link
(and its ``#fragment``) found, every formula typeset by the bundled MathJax with no raw ``$...$``
left in the text; then scans every file of the site for answers, hidden tests and judge values
with the students' copy's scanner (``grading/leaks.py``). Screenshots: ``test-artifacts/
site-home.png``, ``site-lecture.png``, ``site-assignment.png``, ``site-playground.png`` and
``site-widget.png`` (lecture 3's ZeRO view as the site shows it).
"""

from __future__ import annotations

import functools
import html
import http.server
import re
import shutil
import subprocess
import sys
import threading
import time
import urllib.parse
from pathlib import Path

import nbformat
import pytest
from bs4 import BeautifulSoup
from jupyterlab_harness import chromium, screenshot

from grading import leaks

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import build_site  # noqa: E402

pytestmark = [pytest.mark.browser, pytest.mark.slow]

LECTURES = sorted(p.stem for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
ASSIGNMENTS = sorted(p.name for p in (ROOT / "assignments").iterdir()
                     if (p / f"{p.name}.ipynb").exists())
RAW_TEX = re.compile(r"\$[^$\s](?:[^$\n]*[^$\s])?\$(?!\d)|\\\(|\\\[")
# What the page shows as text, without code (where "$" and "\(" are literal) or typeset math.
VISIBLE_TEXT = """() => {
    const body = document.body.cloneNode(true);
    body.querySelectorAll('pre, code, script, style, mjx-container, .highlight')
        .forEach(e => e.remove());
    return body.innerText;
}"""
IMAGES = """() => [...document.images].map(
    i => ({src: i.currentSrc || i.src, ok: i.complete && i.naturalWidth > 0}))"""
MATH = """async () => {
    const math = document.querySelectorAll('.math');
    if (math.length === 0) return {math: 0, typeset: 0, errors: 0};
    await window.MathJax.startup.promise;
    return {math: math.length,
            typeset: [...math].filter(e => e.querySelector('mjx-container')).length,
            errors: document.querySelectorAll('mjx-merror').length};
}"""


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site") / "site"
    t0 = time.perf_counter()
    run = subprocess.run([sys.executable, "scripts/build_site.py", "--out", str(out)], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    assert "WARNING" not in run.stderr and "ERROR" not in run.stderr, run.stderr[-3000:]
    print(f"site built in {time.perf_counter() - t0:.1f} s")
    return out


@pytest.fixture(scope="module")
def base_url(site):
    handler = functools.partial(_QuietHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="module")
def pages(site, base_url) -> dict:
    """Every HTML page of the site opened once in Chromium: what it logged, loaded and shows."""
    found = {}
    with chromium() as browser:
        for path in sorted(site.rglob("*.html")):
            rel = path.relative_to(site).as_posix()
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            seen = {"console": [], "failed": [], "outside": []}
            page.on("console", lambda m, s=seen: m.type == "error" and s["console"].append(m.text))
            page.on("pageerror", lambda e, s=seen: s["console"].append(str(e)))
            page.on("requestfailed", lambda r, s=seen: s["failed"].append(r.url))
            page.on("response", lambda r, s=seen: r.status >= 400 and s["failed"].append(r.url))
            page.on("request", lambda r, s=seen: not r.url.startswith((base_url, "data:"))
                    and s["outside"].append(r.url))
            page.goto(base_url + rel, wait_until="load")
            seen["math"] = page.evaluate(MATH)
            page.wait_for_load_state("networkidle")
            seen["images"] = page.evaluate(IMAGES)
            seen["text"] = page.evaluate(VISIBLE_TEXT)
            seen["links"] = page.eval_on_selector_all("a[href]", "as => as.map(a => a.href)")
            _screenshot(page, rel)
            page.close()
            found[rel] = seen
    return found


def _screenshot(page, rel: str) -> None:
    """The closing note's screenshots: home, a lecture's figure with a formula, an assignment."""
    if rel == "index.html":
        screenshot(page, "site-home")
    elif rel == "assignments/a1_training_state.html":
        screenshot(page, "site-assignment")
    elif rel == "lectures/03_zero_fsdp.html":  # a lecture widget: its note and its picture
        note = page.locator(".admonition.note", has_text="needs a running kernel")
        note.first.scroll_into_view_if_needed()
        page.evaluate("() => window.scrollBy({top: 250, behavior: 'instant'})")
        screenshot(page, "site-widget")
    elif rel == "lectures/06_device_mesh.html":  # the playground: its note and first figure
        note = page.locator(".admonition.note", has_text="needs a running kernel")
        note.scroll_into_view_if_needed()
        page.evaluate("() => window.scrollBy({top: 350, behavior: 'instant'})")
        screenshot(page, "site-playground")
    elif rel == "lectures/02_data_parallel.html":
        # a typeset formula with the nearest figure below it, both in one tall view
        top, span = page.evaluate("""() => {
            const top = e => e.getBoundingClientRect().top + window.scrollY;
            let best = null;
            for (const m of document.querySelectorAll('mjx-container'))
                for (const i of document.querySelectorAll('.cell_output img'))
                    if (top(i) > top(m) && (!best || top(i) - top(m) < best[2]))
                        best = [top(m), top(i) - top(m) + i.height, top(i) - top(m)];
            return best.slice(0, 2);
        }""")
        page.set_viewport_size({"width": 1400, "height": int(min(span + 200, 2000))})
        page.evaluate("y => window.scrollTo({top: y, behavior: 'instant'})", top - 120)
        screenshot(page, "site-lecture")


def test_every_lecture_and_assignment_has_a_page(site):
    assert LECTURES and ASSIGNMENTS
    for name in LECTURES:
        assert (site / "lectures" / f"{name}.html").exists(), name
    for name in ASSIGNMENTS:
        assert (site / "assignments" / f"{name}.html").exists(), name
    for name in ("index", "run", "instructor"):
        assert (site / f"{name}.html").exists(), name
    assert not list(site.rglob("*.ipynb")), "the site should show notebooks, not ship them"


def test_home_page_has_the_course_map(site):
    soup = BeautifulSoup((site / "index.html").read_text(encoding="utf-8"), "html.parser")
    rows = soup.select("table tbody tr")
    modules = build_site.course_map()
    assert len(rows) == len(modules) == len(LECTURES)
    readme = build_site.readme_rows((ROOT / "README.md").read_text(encoding="utf-8"))
    assert len(readme) >= 7
    for row, m in zip(rows, modules):
        hrefs = [a["href"] for a in row.select("a[href]")]
        assert f"lectures/{m.lecture}.html" in hrefs, m.lecture
        if m.assignment:
            assert f"assignments/{m.assignment}.html" in hrefs, m.assignment
        text = re.sub(r"\s", "", row.get_text()).replace("\u2019", "'")  # (smart quotes)
        assert re.sub(r"\s", "", m.title) in text, m.lecture
        if m.lecture in readme:  # what it covers and what runs on real ranks, from README
            for said in readme[m.lecture]:
                assert re.sub(r"[\s`]", "", said) in text, (m.lecture, said)


def test_run_page_has_the_readmes_two_commands(site):
    soup = BeautifulSoup((site / "run.html").read_text(encoding="utf-8"), "html.parser")
    blocks = [pre.get_text() for pre in soup.select("pre")]
    assert any(re.search(r"make lab\b.*\n.*make test\b", b) for b in blocks), blocks


def test_every_page_loads_without_console_errors(pages):
    assert len(pages) >= len(LECTURES) + len(ASSIGNMENTS) + 3
    for rel, seen in pages.items():
        assert not seen["console"], (rel, seen["console"])
        assert not seen["failed"], (rel, seen["failed"])
        assert not seen["outside"], (rel, "requests leave the site", seen["outside"])


def test_every_image_loads(pages):
    for rel, seen in pages.items():
        broken = [i["src"] for i in seen["images"] if not i["ok"]]
        assert not broken, (rel, broken)
    figures = sum(len(pages[f"lectures/{name}.html"]["images"]) for name in LECTURES)
    assert figures >= len(LECTURES), "the lectures' figures are missing"


def test_every_internal_link_resolves(site, pages, base_url):
    checked = 0
    for rel, seen in pages.items():
        for href in seen["links"]:
            if not href.startswith(base_url):
                continue
            url = urllib.parse.urlsplit(href)
            target = site / urllib.parse.unquote(url.path.removeprefix("/"))
            if target.is_dir():
                target = target / "index.html"
            assert target.is_file(), (rel, href)
            if url.fragment and target.suffix == ".html":
                ids = _ids(target)
                assert urllib.parse.unquote(url.fragment) in ids, (rel, href)
            checked += 1
    assert checked > 100


@functools.lru_cache(maxsize=None)
def _ids(path: Path) -> frozenset:
    soup = BeautifulSoup(path.read_text(encoding="utf-8"), "html.parser")
    return frozenset(e["id"] for e in soup.select("[id]"))


def test_formulas_render(pages):
    total = 0
    for rel, seen in pages.items():
        math = seen["math"]
        assert math["typeset"] == math["math"] and math["errors"] == 0, (rel, math)
        raw = RAW_TEX.findall(seen["text"])
        assert not raw, (rel, "raw TeX in the text", raw[:3])
        total += math["typeset"]
    assert pages["lectures/01_training_state.html"]["math"]["typeset"] > 0
    assert total > 20, total


def test_raw_tex_check_sees_dollars():
    assert RAW_TEX.findall("the cost is $N \\cdot 16$ bytes, or \\(x\\)") == [
        "$N \\cdot 16$", "\\("]
    assert not RAW_TEX.findall("export COURSE_DATA=$HOME/dtp, costs $5 and $6")


def _widget_outputs(name: str) -> int:
    nb = nbformat.read(ROOT / "notebooks" / f"{name}.ipynb", as_version=4)
    return sum(build_site.WIDGET_VIEW in o.get("data", {}) for c in nb.cells
               for o in c.get("outputs", []))


def test_every_widget_says_it_needs_a_kernel_and_shows_its_picture(site, pages):
    widgets = {name: _widget_outputs(name) for name in LECTURES if _widget_outputs(name)}
    assert {"01_training_state", "02_data_parallel", "03_zero_fsdp", "04_tensor_parallel",
            "05_pipeline_parallel", "06_device_mesh", "08_jax_sharding",
            "09_activations"} <= set(widgets)
    for name, count in widgets.items():
        soup = BeautifulSoup((site / "lectures" / f"{name}.html").read_text(encoding="utf-8"),
                             "html.parser")
        notes = [n for n in soup.select(".admonition.note") if "needs a running kernel" in
                 n.get_text()]
        assert len(notes) == count, name  # one note where each widget stands
        loaded = {i["src"].rsplit("/", 1)[-1] for i in pages[f"lectures/{name}.html"]["images"]
                  if i["ok"]}
        for note in notes:
            assert note.select_one("a[href='../run.html']"), name
            picture = note.find_next(class_="cell_output").select_one("img")
            assert picture is not None and picture["src"].rsplit("/", 1)[-1] in loaded, name
        assert "VBox(children" not in soup.get_text()


def test_a_widgets_picture_takes_its_place():
    view = {build_site.WIDGET_VIEW: {"model_id": "abc", "version_major": 2, "version_minor": 0}}
    picture = nbformat.v4.new_output("display_data", data={**view, "image/png": "iVBORw0KGgo=",
                                                           "text/plain": "numbers"})
    assert [o.data for o in build_site._static(picture, {})] == [{"image/png": "iVBORw0KGgo="}]
    # (the HTML that tells JupyterLab's student to run the cell: the page has its own note)
    picture.data["text/html"] = "<div>run this cell</div><img src='data:image/png;base64,x'/>"
    assert [o.data for o in build_site._static(picture, {})] == [{"image/png": "iVBORw0KGgo="}]
    html_view = {"abc": {"model_name": "VBoxModel", "state": {"children": ["IPY_MODEL_def"]}},
                 "def": {"model_name": "HTMLModel", "state": {"value": "<img src='x'/>"}}}
    bare = nbformat.v4.new_output("display_data", data={**view, "text/plain": "VBox()"})
    assert [o.data for o in build_site._static(bare, html_view)] == [
        {"text/html": "<img src='x'/>"}]


def test_no_page_holds_an_answer(site):
    windows, checks = leaks.secrets()
    assert len(windows) > 100 and len(checks) > 50
    scanned = 0
    for path in site.rglob("*"):
        if path.is_file() and path.suffix in (".html", ".js", ".txt", ".json", ".inv", ""):
            if path.is_relative_to(site / "_static" / "mathjax"):
                continue  # MathJax's own files, from its package
            found = leaks.leaks(leaks.lines(path), windows, checks)
            assert not found, (path.relative_to(site), found[:3])
            scanned += 1
    assert scanned >= len(LECTURES) + len(ASSIGNMENTS)


def test_the_scanner_finds_an_answer_in_a_page(tmp_path):
    windows, checks = leaks.secrets()
    window = sorted(windows)[0]
    page = tmp_path / "page.html"
    code = "\n".join(f'<span class="n">{html.escape(line)}</span>' for line in window)
    page.write_text(f"<html><body><div class='highlight'><pre>{code}</pre></div></body></html>")
    assert leaks.leaks(leaks.lines(page), windows, checks)
    check = html.escape(sorted(checks)[0])
    page.write_text(f"<html><body><pre><span>{check}</span></pre></body></html>")
    assert leaks.leaks(leaks.lines(page), windows, checks)


def test_a_widget_without_saved_output_stops_the_build():
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("Playground()")
    cell.outputs = [nbformat.v4.new_output("display_data", data={
        build_site.WIDGET_VIEW: {"model_id": "abc", "version_major": 2, "version_minor": 0},
        "text/plain": "VBox()"})]
    nb.cells = [cell]
    with pytest.raises(ValueError, match="no saved output"):
        build_site.static_widgets(nb, "demo")


def test_make_site_is_in_the_makefile_the_readme_and_the_workflow():
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^site: setup\b.*\n\t.*scripts/build_site.py --out build/site", makefile,
                     flags=re.M)
    assert re.search(r"^\| `make site` \|", (ROOT / "README.md").read_text(), flags=re.M)
    workflow = (ROOT / ".github" / "workflows" / "site.yml").read_text()
    assert "run: make site" in workflow and "path: build/site" in workflow
    assert "/build/" in (ROOT / ".gitignore").read_text().splitlines()


def test_the_scanner_finds_a_solution_rendered_by_the_site_builder(tmp_path):
    """The same pages made from an instructor's notebook (what must never happen) are caught."""
    from sphinx.cmd.build import build_main

    name = leaks.assignments()[0]
    src, out = tmp_path / "src", tmp_path / "out"
    src.mkdir()
    shutil.copy(ROOT / "solutions" / name / f"{name}.ipynb", src / "index.ipynb")
    assert build_main(["-q", "-b", "html", "-c", str(build_site.CONF), str(src), str(out)]) == 0
    found = leaks.leaks(leaks.lines(out / "index.html"), *leaks.secrets())
    assert "BEGIN SOLUTION" in found and len(found) > 5, found
