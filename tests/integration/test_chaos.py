"""The chaos soak's shorter run (issue 40): ``bench.chaos`` for two minutes with a fault every
ten seconds on average, from a fixed seed, and every invariant it checks held (docs and the
longer runs: bench/README.md, bench/results/chaos.md)."""
from __future__ import annotations

import shutil

import pytest

from bench.chaos import Soak, broken, report

pytestmark = [
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) is not installed"),
    pytest.mark.integration,
    # about four minutes: CI runs it after the default run (scripts/test.sh)
    pytest.mark.extended,
]


def test_two_minutes_of_random_faults_break_no_invariant(tmp_path):
    result = Soak(seed=40, minutes=2, every_s=10, in_flight=8, drain_s=180, root=tmp_path).run()
    assert result["jobs"] > 20 and sum(result["faults"].values()) >= 4, report(result)
    assert not broken(result), report(result)
