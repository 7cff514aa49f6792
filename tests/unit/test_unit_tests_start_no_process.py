"""The folder's guard (tests/unit/conftest.py) is on: a process started here fails the test."""
from __future__ import annotations

import os
import subprocess

import pytest


def test_starting_a_process_in_a_unit_test_fails_it_naming_the_folder():
    with pytest.raises(RuntimeError, match="belongs in tests/integration/"):
        subprocess.run(["true"], check=False)
    with pytest.raises(RuntimeError, match="os.system"):
        os.system("true")


def test_test_files_have_unique_names():
    """tests/unit and tests/integration are not packages: pytest imports each test file by its
    base name, so two files of one name stop the whole run at collection."""
    from collections import Counter
    from pathlib import Path

    names = Counter(path.name for path in (Path(__file__).parents[1]).rglob("test_*.py"))
    assert not [name for name, count in names.items() if count > 1]
