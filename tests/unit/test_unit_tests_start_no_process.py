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
