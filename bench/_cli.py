"""The shared entry point of the benchmarks: run, save the JSON, print the report."""
from __future__ import annotations

import json
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def run_benchmark(run: Callable[[], dict[str, Any]], report: Callable[[dict[str, Any]], str],
                  results: Path, passed: Callable[[dict[str, Any]], bool]) -> int:
    """Exit code 0 when every target holds, 1 when one is missed, 130 when interrupted.

    SIGTERM and SIGHUP become KeyboardInterrupt so that ``run`` stops every process it started.
    """
    def interrupted(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")
    signal.signal(signal.SIGTERM, interrupted)
    signal.signal(signal.SIGHUP, interrupted)
    started = time.monotonic()
    try:
        result = run()
    except KeyboardInterrupt:
        print("\ninterrupted; every process started was stopped", file=sys.stderr)
        return 130
    result["duration_s"] = time.monotonic() - started
    results.parent.mkdir(parents=True, exist_ok=True)
    results.write_text(json.dumps(result, indent=2) + "\n")
    print(report(result))
    print(f"({result['duration_s']:.0f} s{'; logs in ' + result['log_dir'] if 'log_dir' in result else ''})")
    return 0 if passed(result) else 1


def markdown_table(header: list[str], rows: list[list[str]]) -> list[str]:
    """A report's table as Markdown lines (pasted as is into a bench/results/ page)."""
    return ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)] + \
        ["| " + " | ".join(row) + " |" for row in rows]


def machine_note(result: dict[str, Any]) -> str:
    """The machine a run's figures come from (cores, load before it), for a report's heading."""
    machine = result["machine"]
    return f"{machine['cpus']} cores; load {machine['loadavg_before'][0]:.1f} before"
