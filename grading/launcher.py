"""Start a grading process without the import that costs most of its start-up.

    python -m grading.launcher nbgrader autograde a1_training_state ...   # nbgrader's command line
    python -m grading.launcher task RUN_DIR                               # one Slurm array task

``import nbformat`` (which nbgrader, and the grader's own modules, need) imports ``jsonschema``,
whose format checkers import ``rfc3987_syntax`` when it is installed (it is: an extra that
``jupyter-events`` asks for), and that module compiles 39 IRI grammars with ``lark`` at import:
measured on the course machine, ``nbgrader --version`` took 6.1-7.4 s with it and 2.4-2.6 s
without (load 3 on 2 cores). Every grading process paid it: each local worker once, each Slurm
array task twice. Here it is marked as absent before anything is imported, so ``jsonschema``
simply leaves out its ``iri`` / ``iri-reference`` format checks, which nothing in grading uses
(nbformat validates notebooks without format checking). Only the processes started through this
module are affected; the notebook kernels are not.
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    """Run ``nbgrader ARGS`` or the Slurm executor's ``task RUN_DIR`` (see the module doc)."""
    args = sys.argv[1:] if argv is None else list(argv)
    sys.modules.setdefault("rfc3987_syntax", None)  # "not installed" for jsonschema
    if args[:1] == ["nbgrader"]:
        from nbgrader.apps.nbgraderapp import main as nbgrader_main

        sys.argv = ["nbgrader", *args[1:]]  # (nbgrader_config.py reads sys.argv[1])
        return nbgrader_main() or 0
    if args[:1] == ["task"] and len(args) == 2:
        from grading import slurm_executor

        return slurm_executor.main(args)
    print("usage: python -m grading.launcher nbgrader ARGS... | task RUN_DIR", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
