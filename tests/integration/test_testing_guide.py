"""docs/testing.md's scripted-server program, run as written (the page's block is the file:
tests/unit/test_docs.py): its rules (``scope`` and ``seed_mod`` among them) answer as scripted,
and ``/_log`` records each request."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "testing" / "scripted_server.py"


def test_the_scripted_server_example_runs():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run([sys.executable, str(EXAMPLE)], capture_output=True, text=True, env=env, cwd=ROOT,
                         timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.strip().splitlines()[-1] == "scripted server: every rule answered as scripted"
