"""The test tree itself: pytest imports test files by basename ("prepend" import mode, no
packages under tests/), so two test files with one name in different tiers break the
collection of every tier at once. A subset run (``pytest tests/unit``) never sees the clash;
this test does, because it reads the whole tree."""
from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

TESTS = Path(__file__).resolve().parents[1]


def test_test_file_basenames_are_unique_across_tiers():
    by_name: dict[str, list[str]] = defaultdict(list)
    for path in TESTS.rglob("test_*.py"):
        if "__pycache__" in path.parts or ".cache" in path.parts:
            continue
        by_name[path.name].append(str(path.relative_to(TESTS)))
    clashes = {name: sorted(paths) for name, paths in by_name.items() if len(paths) > 1}
    assert not clashes, f"rename one file of each pair (pytest cannot import both): {clashes}"
