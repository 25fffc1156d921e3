# The two commands a student or maintainer needs (see README.md):
#   make lab    set everything up and open the course in JupyterLab
#   make test   set everything up and run every test
PY := .venv/bin/python
ASSIGNMENT ?= all
# Jupyter refuses to run as root unless told to (containers, CI machines).
ROOT_FLAG := $(if $(filter 0,$(shell id -u)),--allow-root,)

.PHONY: setup lab test test-fast notebooks site lint bench bench-suite clean

setup:
	@scripts/setup.sh

# The student's own copies of lectures and assignments live in workspace/ (ignored by git, never
# overwritten); JupyterLab opens there without nbgrader's instructor menus (jupyter/student/) and
# prints one line with the URL to open (scripts/lab.py; its log: workspace/.jupyter-lab.log).
lab: setup
	@$(PY) scripts/workspace.py
	@$(PY) scripts/lab.py

# Tests run on TEST_WORKERS processes (pytest-xdist); tests that share a kernel, an autograde
# run or a browser stay on one worker (tests/conftest.py). The run ends with the 25 slowest tests.
TEST_WORKERS ?= 2
PARALLEL := -n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder

test: setup
	$(PY) -m pytest $(PARALLEL) --durations=25

test-fast: setup  ## the inner loop: no notebooks, nbgrader or browser (under 3 minutes)
	$(PY) -m pytest $(PARALLEL) --durations=25 -m "not slow and not browser"

notebooks: setup  ## rebuild notebooks/, solutions/ and assignments/ from authoring/
	$(PY) scripts/build_notebooks.py

site: setup  ## the course website from the committed notebooks (not re-executed): build/site
	$(PY) scripts/build_site.py --out build/site

bench: setup  ## launcher start-up, notebook run times (module benchmarks: see benchmarks/)
	$(PY) benchmarks/launch_startup.py
	$(PY) benchmarks/notebook_times.py

bench-suite: setup  ## the whole suite's wall time, test time by area, and where CPUs sat idle
	$(PY) benchmarks/test_suite_time.py $(PARALLEL)

clean:
	rm -rf .venv .pytest_cache .course_data .cache  # (workspace/ is the student's: kept)

# Grading (docs/instructor.md): one target per step, ASSIGNMENT=a1_training_state or all.
SUBMISSIONS ?= submissions
DEST ?= dist/student-course
WORKERS ?= 2
.PHONY: release collect autograde feedback report export formgrader hub bench-grading bench-executors student-copy check

# Self-study (the full repository): grade your own copy of one assignment, make check A=a3_zero
A ?=
check: setup  ## grade workspace/assignments/$(A)/$(A).ipynb as the course's grading does
	@test -n "$(A)" || { echo "usage: make check A=<assignment>, e.g. make check A=a3_zero"; exit 2; }
	$(PY) scripts/grade.py check $(A)

student-copy: setup  ## the folder to publish to students: no answers (dist/student-course)
	$(PY) scripts/student_copy.py $(DEST)

release: setup  ## regenerate assignments/ from solutions/
	$(PY) scripts/grade.py release $(ASSIGNMENT)

collect: setup  ## copy $(SUBMISSIONS)/<student>/... into $$COURSE_DATA/submitted
	$(PY) scripts/grade.py collect $(SUBMISSIONS) $(ASSIGNMENT)

autograde: setup  ## grade every collected submission (parallel) and write the report
	$(PY) scripts/grade.py autograde $(ASSIGNMENT) --workers $(WORKERS)

feedback: setup  ## HTML feedback per student
	$(PY) scripts/grade.py feedback $(ASSIGNMENT)

report: setup  ## re-check grades outside the kernel: reports/<assignment>.csv and .txt
	$(PY) scripts/grade.py report $(ASSIGNMENT)

export: setup  ## grades.csv and grades_verified.csv in $$COURSE_DATA
	$(PY) scripts/grade.py export

# The class on a JupyterHub (root; docs/instructor.md, "A class on JupyterHub"): Ctrl-C stops it.
HUB_PORT ?= 8000
hub: setup  ## the class's JupyterHub from $$COURSE_DATA/roster.csv (then scripts/hub.py release A, ...)
	$(PY) scripts/hub.py up --port $(HUB_PORT)

formgrader: setup  ## JupyterLab on the repository root: Nbgrader > Formgrader
	$(PY) -m jupyter lab $(ROOT_FLAG) --ServerApp.root_dir=.

bench-grading: setup  ## autograde 50 synthetic submissions per assignment
	$(PY) benchmarks/grading.py

bench-executors: setup  ## the local and Slurm executors' throughput, Slurm job timings (root: starts a local Slurm)
	$(PY) benchmarks/grading_executors.py
