"""The test tree's own layout: what a newcomer may rely on when adding a test."""
from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
TEST_FILES = sorted(TESTS.rglob("test_*.py"))


def test_test_files_have_unique_names():
    """tests/unit and tests/integration are not packages: pytest imports each test file by its
    base name, so two files of one name stop the whole run at collection."""
    names = Counter(path.name for path in TEST_FILES)
    assert not [name for name, count in names.items() if count > 1]


def test_no_test_module_imports_another():
    """What several test modules share lives in tests/support: importing a test module from
    another also collects its fixtures and ties the two files' edits together."""
    crossing = []
    for path in TEST_FILES:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(("tests.unit",
                                                                                              "tests.integration")):
                crossing.append(f"{path.relative_to(TESTS)} imports {node.module}")
    assert len(TEST_FILES) > 50 and not crossing, crossing
