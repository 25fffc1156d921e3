"""Student content made inert, wherever a person reads it (issue 41).

Everything a submission holds is hostile: an output, a written answer, an exception's name, a
metadata key. Two places read them:

* **Pages** (the formgrader's submission view, the feedback page, the class report): a cell's
  output of type HTML, JavaScript, SVG, Markdown or LaTeX, or a written answer's raw HTML,
  would run as script in the instructor's browser, inside their authenticated Jupyter session.
  ``grading.filters.InertStudentContent`` (a preprocessor of autograde, and of every
  ``HTMLExporter`` the course configures: the formgrader's and feedback's pages) leaves in a
  notebook only what renders as text or as a picture: plain-text and markdown outputs (the
  markdown's HTML shown as text, like a written answer's), and PNG/JPEG outputs whose data is
  base64 (nothing else can break out of the ``<img src="data:...">`` attribute);
  every other output becomes a text line saying what was removed, output metadata (nbconvert
  writes some of it into HTML attributes) is dropped, and prompts are numbers. The markdown a
  student wrote has its HTML shown as text (``<`` and ``&`` escaped) and its link schemes that
  can run code broken, with a note at the end of the cell; attachments other than base64
  PNG/JPEG are dropped, and references to them with them.
  Then every markdown cell, the course's and the student's, is rendered by
  :func:`markdown2html` (the pages' ``markdown2html`` filter): nbconvert's own renderer, then
  :func:`safe_html` on the **rendered, decoded** HTML, an allowlist of elements, attributes and
  URL schemes (links: http, https, mailto, relative; pictures: base64 PNG/JPEG/GIF/WebP). A
  pattern on the markdown cannot be enough: the renderer removes backslash escapes and decodes
  entities (``javascript\\:``, ``jav&#x61;script:``) after it looked.
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

from course_utils.assess.checks import SUBMIT_MIME, TRACE_MIME

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


def inert_output(output: dict, escape_markdown: bool = True) -> dict:
    """One output with nothing left that a browser would run (see the module doc); with
    ``escape_markdown`` False a markdown part is kept as it is (a page whose renderer keeps
    its HTML to :func:`safe_html`, reading a notebook autograde already made inert)."""
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
        elif mime == "text/markdown" and isinstance(value, str):
            # (a table of numbers, the course's own givens among them: its HTML shown as text,
            # its script links broken, and a page renders it through safe_html)
            kept[mime] = inert_markdown(value)[0] if escape_markdown else value
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
        out["execution_count"] = prompt_number(output.get("execution_count"))
    return out


def prompt_number(value: object) -> int | None:
    """A prompt as a page may print it: a non-negative int, or None (a kernel's message can
    say anything, ``<img onerror=...>`` included, and templates print it unescaped)."""
    return value if type(value) is int and value >= 0 else None


_SCHEME_NOTE = "[the grader shows the HTML of this cell as text and breaks its script links]"
_ATTACHMENT = re.compile(r"attachment:([^\s)\]\"'>]*)")


def drop_attachment_references(source: str, kept: set[str]) -> str:
    """``source`` with every ``attachment:NAME`` whose attachment is not in ``kept`` replaced
    by text saying it was removed (nbconvert would stop on the missing attachment)."""
    return _ATTACHMENT.sub(lambda m: m.group(0) if m.group(1) in kept
                           else "removed-attachment", source)


def inert_markdown(source: str) -> tuple[str, bool]:
    """A student's markdown with its HTML shown as text (``<`` and ``&`` escaped: a formula's
    ``a < b`` still reads as it was written) and its script link schemes broken;
    ``(text, whether it held HTML tags or such a link)``, the note added in that case."""
    text = source.replace("&", "&amp;").replace("<", "&lt;")
    text = _SCHEMES.sub(lambda m: f"{m.group(1)}{m.group(2)} :", text)
    active = bool(_TAG.search(source) or _SCHEMES.search(source))
    return (f"{text}\n\n{_SCHEME_NOTE}" if active else text), active


# ------------------------------------------------------------------------------ rendered HTML

_TAGS = {"a", "abbr", "b", "blockquote", "br", "caption", "code", "dd", "del", "details",
         "div", "dl", "dt", "em", "h1", "h2", "h3", "h4", "h5", "h6", "hr", "i", "img", "kbd",
         "li", "mark", "ol", "p", "pre", "q", "s", "small", "span", "strong", "sub", "summary",
         "sup", "table", "tbody", "td", "tfoot", "th", "thead", "tr", "u", "ul"}
# MathML, as grading.inert renders a cell's TeX (server-side: no script, works offline)
_MATH_TAGS = {"math", "semantics", "mrow", "mi", "mn", "mo", "ms", "mtext", "mspace", "msub",
              "msup", "msubsup", "mfrac", "msqrt", "mroot", "munder", "mover", "munderover",
              "mtable", "mtr", "mtd", "mstyle", "mpadded", "mphantom", "menclose", "merror"}
_MATH_ATTRIBUTES = {"display", "xmlns", "mathvariant", "stretchy", "fence", "separator",
                    "lspace", "rspace", "linethickness", "columnalign", "displaystyle",
                    "scriptlevel", "accent", "accentunder", "minsize", "maxsize",
                    "movablelimits", "form", "width", "height", "depth", "notation",
                    "columnspacing", "rowspacing", "symmetric", "largeop"}
_TAGS |= _MATH_TAGS
_ATTRIBUTES = {"a": {"href", "title", "class"}, "img": {"src", "alt", "title", "width",
                                                        "height"},
               "td": {"style", "colspan", "rowspan"}, "th": {"style", "colspan", "rowspan"},
               "code": {"class"}, "pre": {"class"}, "span": {"class"}, "div": {"class"},
               "ol": {"start"}, "details": {"open"},
               **{f"h{n}": {"id"} for n in range(1, 7)},
               **{t: _MATH_ATTRIBUTES for t in _MATH_TAGS}}
LINK_SCHEMES = ("http", "https", "mailto")
_IMAGE_DATA = re.compile(r"data:image/(png|jpeg|gif|webp);base64,[A-Za-z0-9+/=]*\Z")
_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*):")


def _plain_url(value: str) -> str:
    """``value`` as a browser reads a URL's start: no whitespace or control characters."""
    return "".join(ch for ch in value if ch > " " and unicodedata.category(ch)[0] != "C")


def safe_url(value: str, image: bool = False) -> bool:
    """May a page keep this (decoded) URL? Links: http, https, mailto, or relative (no scheme
    before the first ``/``, ``?`` or ``#``); pictures: base64 PNG/JPEG/GIF/WebP data only."""
    url = _plain_url(value)
    if image:
        return bool(_IMAGE_DATA.match(url))
    scheme = _SCHEME.match(url)
    if scheme:
        return scheme.group(1).lower() in LINK_SCHEMES
    head = re.split(r"[/?#]", url, maxsplit=1)[0]
    return ":" not in head and "\\" not in url


def _allowed(tag: str, name: str, value: str) -> bool:
    if name not in _ATTRIBUTES.get(tag, ()):
        return False
    if name == "xmlns":
        return value == "http://www.w3.org/1998/Math/MathML"
    if name in ("href", "src"):
        return safe_url(value, image=(tag == "img"))
    return True


def safe_html(html: str) -> str:
    """Rendered HTML kept to :data:`_TAGS` and their attributes (:func:`_allowed`); any other
    element is shown as text, any other attribute dropped, comments removed. CSS: only a
    table cell's ``text-align``."""
    import bleach
    from bleach.css_sanitizer import CSSSanitizer

    return bleach.Cleaner(tags=_TAGS, attributes=_allowed,
                          protocols=set(LINK_SCHEMES) | {"data"}, strip=False,
                          strip_comments=True,
                          css_sanitizer=CSSSanitizer(allowed_css_properties=["text-align"])
                          ).clean(html)


PLAIN = "course_plain"  # a cell's metadata key: show its text as it is, not rendered
PLAIN_NOTE = ("[{n:,} characters: shown as written, not rendered (the grader renders "
               "{limit:,} characters of a student's cells per page)]")


def plain_html(text: str, note: str = "") -> str:
    """``text`` as preformatted, escaped HTML (linear time, whatever it holds)."""
    import html

    tail = f'\n<span class="course-note">{html.escape(note)}</span>' if note else ""
    return f'<div class="highlight"><pre>{html.escape(str(text))}{tail}</pre></div>'


def highlight_code(source: str, language: str = "ipython3", metadata=None) -> str:
    """The pages' ``highlight_code`` filter: pygments (what nbconvert does), except for a cell
    marked :data:`PLAIN` (``grading.filters.BoundPageText``), shown as plain text."""
    plain = (metadata or {}).get(PLAIN)
    if plain:
        return plain_html(source, str(plain))
    from nbconvert.filters.highlight import Highlight2HTML

    return Highlight2HTML(pygments_lexer="ipython3")(source, language, metadata)


def mathml(tex: str, display: str = "inline") -> str | None:
    """``tex`` as MathML (latex2mathml: rendered on the server, so a page needs no script and
    no network for its math; browsers draw MathML themselves), or None if it cannot be."""
    from latex2mathml.converter import convert

    try:
        return convert(tex, display=display)
    except Exception:  # noqa: BLE001 - TeX it does not know, nesting too deep: shown as TeX
        return None


def _math_renderer():
    """nbconvert's markdown renderer, its math as MathML (:func:`mathml`) where it can be."""
    from nbconvert.filters.markdown_mistune import IPythonRenderer

    class MathRenderer(IPythonRenderer):
        def inline_math(self, body: str) -> str:
            return mathml(body) or super().inline_math(body)

        def block_math(self, body: str) -> str:
            return mathml(body, "block") or super().block_math(body)

        def latex_environment(self, name: str, body: str) -> str:
            return (mathml(f"\\begin{{{name}}}{body}\\end{{{name}}}", "block")
                    or super().latex_environment(name, body))

    return MathRenderer


def _markdown2html(context, source: str) -> str:
    """The pages' ``markdown2html`` filter: nbconvert's renderer (its math as MathML,
    attachments embedded, headings anchored), then :func:`safe_html`; a cell marked
    :data:`PLAIN` as plain text."""
    from nbconvert.filters.markdown_mistune import MarkdownWithMath

    cell = context.get("cell", {}) or {}
    plain = (cell.get("metadata") or {}).get(PLAIN)
    if plain:
        return plain_html(source, str(plain))
    renderer = _math_renderer()(escape=False, attachments=cell.get("attachments", {}) or {},
                                embed_images=False, anchor_link_text="\u00b6",
                                path=context.get("resources", {}).get("metadata", {})
                                .get("path", ""))
    try:
        return safe_html(MarkdownWithMath(renderer=renderer).render(str(source)))
    except Exception as err:  # noqa: BLE001 - one cell never stops a page (a missing attachment)
        return plain_html(source, f"[not rendered: {one_line(err, 200)}]")


def strip_files_prefix(text: str) -> str:
    """The pages' ``strip_files_prefix`` filter: nothing. nbconvert's removes ``files/`` from
    links after :func:`safe_html` judged them (``files/javascript:...`` would become
    ``javascript:...``), and its pattern for markdown links grows with the square of a run of
    ``[`` (200,000 of them: 6.5 minutes)."""
    return text


try:  # (jinja2 >= 3: pass_context; the filter needs the cell for its attachments)
    from jinja2 import pass_context as _pass_context
except ImportError:  # pragma: no cover - jinja2 < 3
    from jinja2 import contextfilter as _pass_context
markdown2html = _pass_context(_markdown2html)


__all__ = ["LINK_SCHEMES", "PLAIN", "PLAIN_NOTE", "SAFE_IMAGES", "drop_attachment_references",
           "highlight_code", "inert_markdown", "prompt_number",
           "inert_output", "is_base64", "lines", "markdown2html", "one_line", "plain_html",
           "safe_html", "safe_url", "strip_files_prefix"]
