"""Sphinx configuration of the course website (``make site``; ``scripts/build_site.py``).

The pages come from the committed notebooks, never executed here: their outputs are the ones
nbval verified in CI. Everything the pages load is in the built folder (MathJax from the pinned
``sphinx-mathjax-offline`` package, the ``furo`` theme's own files): the build and the pages
need no network.
"""

project = "Distributed Training & Parallelism"
author = "the course's authors"
copyright = "the course's authors"

extensions = ["myst_nb", "sphinx-mathjax-offline"]
html_theme = "furo"
html_title = project
html_static_path = ["_static"]
html_css_files = ["course.css"]
html_favicon = "_static/favicon.svg"  # (without one, every browser logs a 404)
html_copy_source = False  # no notebook sources in the site: only what the pages show
html_show_sourcelink = False
html_last_updated_fmt = None

nb_execution_mode = "off"  # the committed outputs, exactly as CI verified them
nb_ipywidgets_js = {}  # no widget JavaScript from a CDN (the playground's page says why)
nb_merge_streams = True
myst_enable_extensions = ["dollarmath", "amsmath"]
myst_heading_anchors = 3
exclude_patterns = ["_build"]
suppress_warnings = ["myst.header"]  # a lecture's sections may skip a heading level
