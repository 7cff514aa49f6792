"""``prorl_celery.dev.vllmcpu``: the command line that starts a CPU vLLM server (no vLLM needed)."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from prorl_celery.dev.vllmcpu import vllm_command, vllm_env


def cores_printed(line: str) -> set[int]:
    """The cores of taskset's "pid N's current affinity list: 0,2-3"."""
    cores: set[int] = set()
    for part in line.rsplit(":", 1)[1].strip().split(","):
        first, _, last = part.partition("-")
        cores.update(range(int(first), int(last or first) + 1))
    return cores


def test_cpus_confine_the_whole_server_to_those_cores(tmp_path: Path) -> None:
    """The interpreter the command starts (a stand-in that prints its CPU affinity and its
    arguments) runs on the given core only, and the OpenMP binding names the same core: vLLM's
    engine core, free on another core, starved the API server there (see ``vllm_command``)."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        pytest.skip("needs two cores to tell a confined process from a free one")
    interpreter = tmp_path / "python"
    interpreter.write_text('#!/bin/sh\ntaskset --cpu-list --pid $$\necho "$@"\n')
    interpreter.chmod(0o755)
    command = vllm_command(str(interpreter), "/models/tiny", 8123, max_model_len=2048, cpus=str(cores[-1]))
    printed = subprocess.run(command, capture_output=True, text=True, check=True).stdout.splitlines()
    assert cores_printed(printed[0]) == {cores[-1]}, printed
    assert "--model /models/tiny" in printed[1] and "--max-model-len 2048" in printed[1], printed
    assert vllm_env(cpus=str(cores[-1]))["VLLM_CPU_OMP_THREADS_BIND"] == str(cores[-1])


def test_without_cpus_the_server_keeps_the_callers_cores(tmp_path: Path) -> None:
    interpreter = tmp_path / "python"
    interpreter.write_text("#!/bin/sh\ntaskset --cpu-list --pid $$\n")
    interpreter.chmod(0o755)
    printed = subprocess.run(vllm_command(str(interpreter), "/models/tiny", 8123), capture_output=True,
                             text=True, check=True).stdout
    assert cores_printed(printed) == os.sched_getaffinity(0), printed
    assert "VLLM_CPU_OMP_THREADS_BIND" not in vllm_env()
