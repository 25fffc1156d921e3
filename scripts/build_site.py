#!/usr/bin/env python
"""Build the course website from the committed notebooks (``make site``).

    python scripts/build_site.py [--out build/site]     # then open build/site/index.html

The pages are made with Sphinx and myst-nb (pinned in ``requirements.txt``; configuration in
``website/conf.py``) from the lecture notebooks as committed, **never executed here**: their
outputs are the ones nbval verifies in CI. Lectures and assignments are found in their folders
(``notebooks/NN_topic.ipynb``, ``assignments/aN_topic/aN_topic.ipynb``: the released copies,
without answers or hidden tests; ``solutions/`` is never read); the home page's course map
takes each module's description from README.md's table. A widget's place says that it needs a
running kernel and shows the picture it was saved with (its default setting).
Nothing is downloaded: the build and the built pages work offline. ``tests/test_site.py``
builds the site, opens every page in Chromium and scans it for answers.
"""

from __future__ import annotations

import argparse
import copy
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
CONF = ROOT / "website"  # conf.py and _static/
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
WIDGET_NOTE = """\
```{note}
**This widget needs a running kernel.** Its controls do nothing on this static page: below is
the picture it starts with, as saved by the course's tested run. To move the controls,
{doc}`run the course yourself </run>` and open this lecture in JupyterLab.
```"""


@dataclass
class Module:
    """One module of the course map: its lecture and, if released, its assignment."""

    number: int
    lecture: str  # notebook stem, e.g. "01_training_state"
    title: str  # the lecture's "# Module N: ..." heading, without the "#"
    summary: str  # what the lecture covers (README's table), or ""
    ranks: str  # what runs on real ranks (README's table), or ""
    assignment: str | None  # e.g. "a1_training_state"
    assignment_title: str


def _title(nb_path: Path) -> str:
    """A notebook's first heading, without its ``#``s."""
    nb = nbformat.read(nb_path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            for line in cell.source.splitlines():
                if line.startswith("#"):
                    return line.lstrip("#").strip()
    raise ValueError(f"nb_path={nb_path}: has no markdown heading to title its page")


def readme_rows(readme: str) -> dict[str, tuple[str, str]]:
    """README's course table: lecture stem -> (what it covers, what runs on real ranks)."""
    rows = {}
    row = re.compile(r"^\|\s*\d+\s*\|\s*`([^`]+)`\s*—\s*(.*?)\s*\|\s*`[^`]+`\s*\|\s*(.*?)\s*\|$")
    for line in readme.splitlines():
        m = row.match(line.strip())
        if m:
            rows[m.group(1)] = (m.group(2), m.group(3))
    return rows


def course_map(root: Path = ROOT) -> list[Module]:
    """Every lecture in ``notebooks/``, with its README row and its assignment, by number."""
    rows = readme_rows((root / "README.md").read_text(encoding="utf-8"))
    released = {int(m.group(1)): p.name for p in sorted((root / "assignments").iterdir())
                if (m := re.fullmatch(r"a(\d+)_\w+", p.name)) and (p / f"{p.name}.ipynb").exists()}
    modules = []
    for nb in sorted((root / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        number = int(nb.stem[:2])
        summary, ranks = rows.get(nb.stem, ("", ""))
        a = released.get(number)
        a_title = _title(root / "assignments" / a / f"{a}.ipynb") if a else ""
        modules.append(Module(number, nb.stem, _title(nb), summary, ranks, a, a_title))
    if not modules:
        raise ValueError(f"root={root}: no lecture notebooks in notebooks/")
    return modules


def home_page(modules: list[Module], readme: str) -> str:
    """The home page: what the course teaches, the course map, and the navigation."""
    learn = readme.split("## What you learn", 1)[1].split("\n|", 1)[0].strip()
    rows = []
    for m in modules:
        lecture = f"{{doc}}`{m.title} <lectures/{m.lecture}>`" + (
            f" — {m.summary}" if m.summary else "")
        a = f"{{doc}}`{m.assignment_title} <assignments/{m.assignment}>`" if m.assignment else ""
        rows.append(f"| {m.number} | {lecture} | {m.ranks} | {a} |")

    def toc(caption: str, docs: list[str]) -> str:
        return "\n".join(["```{toctree}", ":hidden:", ":maxdepth: 1",
                          f":caption: {caption}", "", *docs, "```"])

    return "\n\n".join([
        "# Distributed Training & Parallelism", learn,
        "Every page below shows a notebook exactly as the course's tests ran it: figures, "
        "formulas, code and outputs. Read a module here, then {doc}`run it yourself <run>`: "
        "every \"GPU\" in the course is a real process on an ordinary CPU laptop.",
        "## The course map",
        "| # | lecture | what runs on real ranks | assignment |\n|---|---|---|---|\n"
        + "\n".join(rows),
        "Work through a lecture top to bottom, then its assignment. Instructors: "
        "{doc}`the instructor's guide <instructor>` says how assignments are released and "
        "graded.",
        toc("Start", ["run"]),
        toc("Lectures", [f"lectures/{m.lecture}" for m in modules]),
        toc("Assignments", [f"assignments/{m.assignment}" for m in modules if m.assignment]),
        toc("Instructors", ["instructor"]),
    ]) + "\n"


def run_page(readme: str) -> str:
    """The "run it yourself" page: the README's two commands and what they do."""
    start = readme.index("```bash")
    commands = readme[start:readme.index("## What you learn")].strip()
    after_table = readme.split("## What you learn", 1)[1].split("## ", 1)[0]
    workspace = after_table[after_table.index("`make lab` opens"):].strip()
    return "\n\n".join([
        "# Run it yourself",
        "The pages of this site are static: to run the lectures, change them and do the "
        "assignments, clone the course's repository and, in its folder, run:",
        commands, "## Your workspace", workspace,
        "Interactive parts, the widgets in the lectures and the device-mesh playground, need a "
        "running kernel, which `make lab` starts: on the site you see only the picture each "
        "starts with.",
    ]) + "\n"


def _widget_outputs(model_id: str, state: dict) -> list:
    """The outputs saved in the Output widgets under a widget (depth first)."""
    model = state.get(model_id)
    if model is None:
        return []
    if model["model_name"] == "OutputModel":
        return [nbformat.from_dict(o) for o in model["state"].get("outputs", [])]
    found = []
    for child in model["state"].get("children", []):
        found += _widget_outputs(str(child).removeprefix("IPY_MODEL_"), state)
    return found


def _widget_html(model_id: str, state: dict) -> list:
    """The HTML views under a widget (depth first), as ``text/html`` outputs: what an
    ``ipywidgets.HTML`` showed when the notebook was saved (the playground's figure)."""
    model = state.get(model_id)
    if model is None:
        return []
    if model["model_name"] == "HTMLModel" and "<img" in model["state"].get("value", ""):
        return [nbformat.v4.new_output("display_data", {"text/html": model["state"]["value"]})]
    found = []
    for child in model["state"].get("children", []):
        found += _widget_html(str(child).removeprefix("IPY_MODEL_"), state)
    return found


def _static(output: nbformat.NotebookNode, state: dict) -> list:
    """What a page without a kernel shows for a widget's output: the picture the output
    carries besides the widget (``course_utils.widgets``), else what its Output widgets or
    HTML views were saved with."""
    rich = {k: v for k, v in output.data.items() if k not in (WIDGET_VIEW, "text/plain")}
    if "image/png" in rich:  # (its HTML says "run this cell": the page's note says it here)
        rich = {"image/png": rich["image/png"]}
    if rich:
        return [nbformat.v4.new_output("display_data", rich, metadata=output.get("metadata", {}))]
    model_id = output.data[WIDGET_VIEW]["model_id"]
    return _widget_outputs(model_id, state) or _widget_html(model_id, state)


def static_widgets(nb: nbformat.NotebookNode, name: str) -> nbformat.NotebookNode:
    """A copy of ``nb`` whose widget outputs are replaced by the picture or the outputs they
    were saved with, each widget cell preceded by a note that it needs a running kernel."""
    nb = copy.deepcopy(nb)
    state = nb.metadata.pop("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
    cells = []
    for cell in nb.cells:
        views = [o for o in cell.get("outputs", []) if WIDGET_VIEW in o.get("data", {})]
        if views:
            outputs = []
            for o in cell.outputs:
                if WIDGET_VIEW in o.get("data", {}):
                    saved = _static(o, state)
                    if not saved:
                        raise ValueError(f"{name}: a widget has no saved output to show "
                                         "(rebuild the notebook: make notebooks)")
                    outputs += saved
                else:
                    outputs.append(o)
            cell.outputs = outputs
            cells.append(nbformat.v4.new_markdown_cell(WIDGET_NOTE))
        cells.append(cell)
    nb.cells = cells
    return nb


def _write(path: Path, text: str) -> None:
    """Write ``text`` unless the file already holds it (Sphinx then skips unchanged pages)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists() or path.read_text(encoding="utf-8") != text:
        path.write_text(text, encoding="utf-8")


def stage(src: Path, root: Path = ROOT) -> list[str]:
    """Write the site's sources into ``src``; return their document names."""
    readme = (root / "README.md").read_text(encoding="utf-8")
    modules = course_map(root)
    pages = {"index.md": home_page(modules, readme), "run.md": run_page(readme),
             "instructor.md": (root / "docs" / "instructor.md").read_text(encoding="utf-8")}
    for m in modules:
        nb = nbformat.read(root / "notebooks" / f"{m.lecture}.ipynb", as_version=4)
        pages[f"lectures/{m.lecture}.ipynb"] = nbformat.writes(static_widgets(nb, m.lecture))
        if m.assignment:
            pages[f"assignments/{m.assignment}.ipynb"] = (
                root / "assignments" / m.assignment / f"{m.assignment}.ipynb").read_text(
                encoding="utf-8")
    for rel, text in pages.items():
        _write(src / rel, text)
    for old in src.rglob("*"):  # a lecture or assignment that was removed
        if old.is_file() and old.relative_to(src).as_posix() not in pages:
            old.unlink()
    return sorted(str(Path(rel).with_suffix("")) for rel in pages)


def build(out: Path, quiet: bool = True) -> float:
    """Stage the sources next to ``out`` and build the HTML site into ``out``; seconds taken."""
    from sphinx.cmd.build import build_main

    t0 = time.perf_counter()
    out = out.resolve()
    src, doctrees = out.with_name(out.name + "-src"), out.with_name(out.name + "-doctrees")
    stage(src)
    args = ["-b", "html", "-c", str(CONF), "-d", str(doctrees), *(["-q"] if quiet else []),
            str(src), str(out)]
    if build_main(args) != 0:
        raise RuntimeError(f"out={out}: Sphinx failed (its messages are above)")
    sources = out / "_sources"  # (left empty: the site does not ship its notebooks)
    if sources.is_dir() and not any(sources.iterdir()):
        sources.rmdir()
    (out / ".nojekyll").touch()  # GitHub Pages: serve _static/ and _images/ as they are
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "site",
                        help="folder to write the site into (default: build/site)")
    args = parser.parse_args(argv)
    seconds = build(args.out)
    pages = len(list(args.out.rglob("*.html")))
    print(f"site: {pages} pages in {args.out} ({seconds:.1f} s); open {args.out / 'index.html'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
