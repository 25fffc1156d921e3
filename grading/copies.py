"""Copied answers: evidence for the instructor, never a score.

Every student has their own numbers (``course_utils.assess.variants``). A wrong answer that is right
for a classmate's numbers may have been copied from that classmate, or may be the student's
own slip that happens to land there. Three rules keep an honest student from being accused:

1. **A mistake the judge names for the student's own numbers is the student's own** and is
   never compared (:func:`named_mistake`): a1's N = 20e9 with the 12-byte mistake gives
   240 GB, the right answer for N = 15e9, and flagged 2.7 % of honest students before.
2. **Only evidence unlikely by chance is shown** (:func:`matches`): the student's answers
   follow the classmate's numbers on at least two questions, at least one of them right for
   the classmate, nowhere does a right answer of the student's own contradict the classmate's
   numbers, and landing on the classmate's answers by accident is at most :data:`MAX_CHANCE`
   likely (answering at random among each question's known answers; questions linked by a
   common given count once: a slip that scales N, a factor of 2, carries into every answer that
   follows N). The line says how likely ("by chance: 1 in 2,580").
3. Questions whose answers are drawn per submission (functions run on hidden cases) are not
   compared: a copied function is not a copied number.

:func:`evidence` is the rule on values alone (what the report reads from the judge logs, and
what :func:`simulate_class` hands it); ``benchmarks/copy_evidence.py`` measures its false
positives and misses on simulated classes, and the instructor's guide states them.
"""

from __future__ import annotations

import functools
import math
import random
from typing import Any

from grading import expected, judge

MAX_CHANCE = 1 / 50  # a classmate is named when matching them by chance is at most this likely
MIN_MATCHES = 2  # ... on at least this many questions (a slip can land on one by itself)
SAMPLES = 100  # students' numbers drawn to count each question's distinct right answers


def _close(call: dict, a: Any, b: Any) -> bool:
    if call["kind"] == "choice":
        return a == b
    try:
        a, b = float(a), float(b)
    except (TypeError, ValueError):
        return a == b
    return abs(a - b) <= max(call["rel"] * max(abs(a), abs(b)), call["abs_tol"])


def named_mistake(rules, gid: str, pairs: list, givens) -> bool:
    """Is a value of this failed cell one of the mistakes the judge names for these numbers?"""
    try:
        calls = expected.checked(rules, gid, givens)
    except Exception:  # noqa: BLE001 - a judge of real ranks or hidden cases: none named
        return False
    got = {n: judge.decode(v) for n, v in pairs}
    return any(c["name"] in got and _close(c, got[c["name"]], wrong)
               for c in calls for wrong, _ in c["mistakes"])


@functools.lru_cache(maxsize=64)
def answer_space(assignment: str) -> dict[str, int]:
    """``{grade_id: distinct known answers}`` of each question judged by checks alone: the
    right answers and the mistakes the judge names, over :data:`SAMPLES` students' numbers
    (the values of one cell together: a cell of two values counts distinct pairs)."""
    from course_utils.assess import variants

    rules = judge.load(assignment)
    seen: dict[str, set] = {}
    for i in range(SAMPLES):
        g = variants.givens(assignment, student=f"sample{i:03d}")
        for gid, values in expected.right_values(rules, g).items():
            known = seen.setdefault(gid, set())
            known.add(repr(sorted(values.items())))
            for call in expected.checked(rules, gid, g):
                for wrong, _ in call["mistakes"]:
                    known.add(repr(sorted({**values, call["name"]: wrong}.items())))
    return {gid: len(answers) for gid, answers in seen.items()}


@functools.lru_cache(maxsize=64)
def linked(assignment: str) -> dict[str, str]:
    """``{grade_id: its group}``: questions whose judges read a given in common are one group
    (a1's Q1, Q2 and Q3 all follow N). A slip that scales with a given (a factor of 2, a unit)
    carries into every answer that follows it and can land on the answers of a classmate whose
    given is scaled so; only matches on questions of other givens are independent evidence."""
    rules = judge.load(assignment)
    reads = {gid: expected.givens_read(rules, assignment, gid) or set()
             for gid in answer_space(assignment)}
    group = {gid: gid for gid in reads}
    for a in sorted(reads):
        for b in sorted(reads):
            if a < b and reads[a] & reads[b] and group[a] != group[b]:
                old, new = group[b], group[a]
                group = {k: new if v == old else v for k, v in group.items()}
    return group


def _gives_right(rules, gid: str, pairs: list, givens, reference: dict) -> bool:
    ref = [tuple(p) for p in reference.get(gid, pairs)]
    return judge.judge_cell(rules, gid, pairs, ref, givens=givens).passed


def _gives(rules, gid: str, pairs: list, givens, reference: dict) -> bool:
    """Do these numbers give these values: right for them, or a mistake the judge names?"""
    return _gives_right(rules, gid, pairs, givens, reference) or \
        named_mistake(rules, gid, pairs, givens)


def matches(assignment: str, students: dict[str, tuple[Any, dict[str, list], list[str]]],
            reference: dict[str, list]) -> dict[str, list[tuple[float, list[str], list[str]]]]:
    """``{student: [(chance, [classmates], [grade_id, ...]), ...]}`` from values alone, most
    unlikely first; classmates whose numbers give the same answers on the same questions are
    one entry (the evidence cannot tell them apart), and a classmate whose matched questions are
    a part of another's is left out (the wider match explains more). ``students``: ``{student: (their givens,
    {grade_id: [(name, encoded value)] of each failed cell}, [grade_id of each cell right])}``;
    ``reference``: the reference run's submissions per cell (what the judge compares a
    classmate's numbers against).

    Compared: the student's wrong answers that are no mistake the judge names for their own
    numbers. A classmate is named when at least :data:`MIN_MATCHES` of them are what the
    classmate's numbers give (right for them, or a mistake the judge names for them), at least
    one is right for them, the chance of landing on them by accident is at most
    :data:`MAX_CHANCE` (one over each question's known answers, :func:`answer_space`, multiplied
    over the groups of linked questions, :func:`linked`, each group once), and no question the
    student got right for their own numbers has another answer for the
    classmate's (a student who copies hands in the classmate's values everywhere)."""
    rules = judge.load(assignment)
    drawn = set(getattr(rules, "HIDDEN_CASES", {}))
    space, group = answer_space(assignment), linked(assignment)
    rights = {s: expected.right_values(rules, g) for s, (g, _, _) in students.items()}
    out: dict[str, list] = {}
    for student, (mine, failed, passed) in students.items():
        compared = {gid: pairs for gid, pairs in failed.items()
                    if gid in space and gid not in drawn
                    and not named_mistake(rules, gid, pairs, mine)}
        mine_right = {gid: _pairs(reference[gid], rights[student][gid]) for gid in passed
                      if gid in rights[student] and gid in reference}
        found: dict[tuple, list] = {}
        for peer, (theirs, _, _) in students.items():
            if peer == student or dict(theirs) == dict(mine) or len(compared) < MIN_MATCHES:
                continue
            gids = [gid for gid, pairs in compared.items()
                    if _gives(rules, gid, pairs, theirs, reference)]
            weights: dict[str, float] = {}
            for gid in gids:
                weights[group[gid]] = max(weights.get(group[gid], 1.0), space[gid])
            p = math.prod(1.0 / w for w in weights.values())
            if len(gids) < MIN_MATCHES or p > MAX_CHANCE or not any(
                    _gives_right(rules, gid, compared[gid], theirs, reference) for gid in gids):
                continue
            if any(not _gives(rules, gid, pairs, theirs, reference)
                   for gid, pairs in mine_right.items()):
                continue  # a right answer of the student's own that the classmate's numbers
                #           would not give: the student worked with their own numbers there
            entry = found.setdefault(tuple(gids), [p, []])
            entry[1].append(peer)
        # a classmate whose numbers explain only some of the questions another's explain is the
        # weaker explanation (a7's small answer spaces: two students share a table) and is not named
        widest = [g for g in found if not any(set(g) < set(other) for other in found)]
        out[student] = sorted((found[g][0], found[g][1], list(g)) for g in widest)
    return out


def _who(peers: list[str]) -> str:
    shown = peers[:3] + ([f"{len(peers) - 3} more with the same numbers"] if len(peers) > 3
                         else [])
    return shown[0] if len(shown) == 1 else ", ".join(shown[:-1]) + " and " + shown[-1]


def evidence(assignment: str, students: dict[str, tuple[Any, dict[str, list], list[str]]],
             reference: dict[str, list]) -> dict[str, list[str]]:
    """``{student: [line, ...]}``: :func:`matches` in words, for the report."""
    return {student: [
        f"{', '.join(gids)}: the answers are what the numbers of {_who(peers)} give (right, or "
        f"a mistake the judge knows for them), not {student}'s own, and none of the mistakes "
        f"the judge knows for {student}'s numbers (by chance: 1 in {round(1 / p):,}; evidence "
        f"of a copied answer, not a score: docs/instructor.md)" for p, peers, gids in found]
        for student, found in matches(assignment, students, reference).items()}


# ------------------------------------------------------------------------------ simulated


def _pairs(ref_pairs: list, values: dict[str, Any]) -> list[tuple[str, Any]]:
    """The reference's submissions of one cell with a student's values put in (a judge's
    ``w1_local[0]``, ``w1_local[1]`` are one submitted tuple ``w1_local``), encoded as a
    kernel sends them; what the judge does not check stays the reference's."""
    import re

    from course_utils.assess.checks import encode

    indexed: dict[str, dict[int, Any]] = {}
    for name, value in values.items():
        m = re.fullmatch(r"(\w+)\[(\d+)\]", name)
        if m:
            indexed.setdefault(m.group(1), {})[int(m.group(2))] = value
    out = []
    for name, value in ref_pairs:
        if name in values:
            value = encode(values[name])
        elif name in indexed:
            value = encode(tuple(indexed[name][i] for i in sorted(indexed[name])))
        out.append((name, value))
    return out


def simulate_class(assignment: str, reference: dict[str, list], honest: int = 30,
                   copiers: int = 10, seed: int = 0, mistake_rate: float = 1 / 3,
                   unknown_rate: float = 0.0
                   ) -> tuple[dict[str, tuple[Any, dict[str, list], list[str]]], dict[str, str | None]]:
    """A class on values alone: ``honest`` students who answer each question judged by checks
    right, or with one of the mistakes the judge names for their numbers (``mistake_rate``), or
    with a mistake the judge does not know (``unknown_rate``: the right value times 2, or
    another allowed choice); and ``copiers`` who hand in an honest classmate's values (one with
    other numbers). ``reference``: the reference run's submissions per cell. Returns
    ``(students, copied_from)`` in the form :func:`evidence` takes, and
    who each student copied (None: honest)."""
    from course_utils.assess import variants

    rules = judge.load(assignment)
    rng = random.Random(f"{assignment}/{seed}")
    ids = [f"s{seed}-{i:03d}" for i in range(honest + copiers)]
    givens = {s: variants.givens(assignment, student=s) for s in ids}
    answers: dict[str, dict[str, list]] = {}
    for s in ids[:honest]:
        answers[s] = {}
        for gid, values in expected.right_values(rules, givens[s]).items():
            if gid not in reference:
                continue
            calls = {c["name"]: c for c in expected.checked(rules, gid, givens[s])}
            chosen = dict(values)
            roll = rng.random()
            names = [n for n in chosen if calls.get(n, {}).get("mistakes")]
            if roll < mistake_rate and names:
                name = rng.choice(names)
                chosen[name] = rng.choice(calls[name]["mistakes"])[0]
            elif roll < mistake_rate + unknown_rate and chosen:
                name = rng.choice(list(chosen))
                call = calls.get(name, {"kind": "number"})
                if call["kind"] == "choice":
                    others = [a for a in call["allowed"] if a != chosen[name]]
                    chosen[name] = rng.choice(others) if others else chosen[name]
                else:
                    chosen[name] = chosen[name] * 2
            answers[s][gid] = _pairs(reference[gid], chosen)
    copied_from: dict[str, str | None] = dict.fromkeys(ids[:honest])
    for s in ids[honest:]:
        peers = [p for p in ids[:honest] if dict(givens[p]) != dict(givens[s])]
        peer = rng.choice(peers)
        copied_from[s], answers[s] = peer, answers[peer]
    students = {}
    for s in ids:
        failed, passed = {}, []
        for gid, pairs in answers[s].items():
            if judge.judge_cell(rules, gid, pairs, [tuple(p) for p in reference[gid]],
                                givens=givens[s]).passed:
                passed.append(gid)
            else:
                failed[gid] = pairs
        students[s] = (givens[s], failed, passed)
    return students, copied_from


__all__ = ["MAX_CHANCE", "MIN_MATCHES", "answer_space", "evidence", "linked", "matches",
           "named_mistake", "simulate_class"]
