# The two commands a student or maintainer needs (see README.md):
#   make lab    set everything up and open the course in JupyterLab
#   make test   set everything up and run every test
PY := .venv/bin/python
ASSIGNMENT ?= all

.PHONY: setup lab test test-fast notebooks lint bench clean

setup:
	@scripts/setup.sh

lab: setup
	$(PY) -m jupyter lab notebooks/

test: setup
	$(PY) -m pytest

test-fast: setup  ## skip notebook, nbgrader and browser runs
	$(PY) -m pytest -m "not slow and not browser"

notebooks: setup  ## rebuild notebooks/, solutions/ and assignments/ from authoring/
	$(PY) scripts/build_notebooks.py

bench: setup
	$(PY) benchmarks/launch_startup.py

clean:
	rm -rf .venv .pytest_cache .course_data
