"""Golden files: `assert_golden(name, text)` compares with golden/<name>.

Set CORRAL_UPDATE_GOLDEN=1 to (re)write them; review the diff before committing.
"""

from __future__ import annotations

import os
from pathlib import Path

HERE = Path(__file__).parent
GOLDEN = HERE / "golden"
FIXTURES = HERE / "fixtures"


def assert_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("CORRAL_UPDATE_GOLDEN") == "1":
        path.write_text(text, encoding="utf-8")
    expected = path.read_text(encoding="utf-8")
    assert text == expected, f"{name} differs from its golden file (CORRAL_UPDATE_GOLDEN=1)"


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text(encoding="utf-8")
