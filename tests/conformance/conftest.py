"""`case`: the conformance suite's parametrisation over every backend in `cases.CASES`."""

from __future__ import annotations

import pytest

from tests.conformance.cases import CASES, Case


@pytest.fixture(params=[pytest.param(c, id=c.name, marks=c.marks) for c in CASES])
def case(request: pytest.FixtureRequest) -> Case:
    c: Case = request.param
    name = request.node.originalname.removeprefix("test_")
    if name in c.not_applicable:
        pytest.skip(f"{c.name}: not applicable: {c.not_applicable[name]}")
    param = request.node.name.removeprefix("test_").split("[", 1)[-1].rstrip("]").split("-")
    for key, why in c.known_failures.items():
        test, _, want = key.partition("[")
        if test == name and (not want or want.rstrip("]") in param):
            request.applymarker(pytest.mark.xfail(strict=True, reason=f"{c.name}: {why}"))
    return c


@pytest.fixture
def isolating(case: Case) -> Case:
    """Like `case`, for guarantee tests: only backends that isolate."""
    if not case.isolates:
        pytest.skip(f"{case.name} isolates nothing (contract tests only)")
    return case
