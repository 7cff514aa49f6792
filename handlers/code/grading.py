"""Verdicts: what the judge saw in the sandbox, compared on the worker with the hidden outputs.

A verdict is one of ``passed``, ``wrong_answer``, ``time_limit``, ``memory_limit`` or
``runtime_error``. Reward is 1.0 only when every test passed.
"""
from __future__ import annotations

import math
import signal
from typing import Any

VERDICTS = ("passed", "wrong_answer", "time_limit", "memory_limit", "runtime_error")
#: a process whose peak RSS reached this fraction of its address-space limit died of memory
MEMORY_NEAR_LIMIT = 0.9


def tokens_match(actual: str, expected: str, float_tolerance: float | None = None) -> bool:
    """Whitespace-normalised, token-wise comparison; numbers within ``float_tolerance``
    (absolute or relative) when a tolerance is given."""
    got, want = actual.split(), expected.split()
    if len(got) != len(want):
        return False
    return all(a == b or (float_tolerance is not None and _close(a, b, float_tolerance))
               for a, b in zip(got, want))


def _close(a: str, b: str, tolerance: float) -> bool:
    try:
        x, y = float(a), float(b)
    except ValueError:
        return False
    if math.isnan(x) or math.isnan(y):
        return False
    return abs(x - y) <= tolerance * max(1.0, abs(y))


def values_match(actual: Any, expected: Any, float_tolerance: float | None = None) -> bool:
    """A function's JSON-encoded return value against the expected one.

    As TACO/APPS graders do, an expected ``[v]`` also accepts ``v`` (their rows often wrap
    the single return value in a list); floats compare within the tolerance (1e-9 when none).
    """
    if _equal(actual, expected, float_tolerance):
        return True
    return isinstance(expected, list) and len(expected) == 1 and _equal(actual, expected[0], float_tolerance)


def _equal(a: Any, b: Any, tolerance: float | None) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b if isinstance(a, bool) and isinstance(b, bool) else False
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        if isinstance(a, int) and isinstance(b, int):
            return a == b
        return math.isclose(a, b, rel_tol=tolerance or 1e-9, abs_tol=tolerance or 1e-9)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_equal(x, y, tolerance) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k], tolerance) for k in a)
    return a == b


def verdict(report: dict[str, Any], test: dict[str, Any], float_tolerance: float | None = None) -> tuple[str, str]:
    """(verdict, reason) for one test from the judge's report and the hidden expectation."""
    if "judge_error" in report:
        return "runtime_error", f"judge: {report['judge_error']}"
    limit = test["time_limit_s"]
    sig = report.get("signal")
    if report.get("killed_at_wall") or sig == signal.SIGXCPU or report.get("cpu_s", 0) > limit:
        return "time_limit", f"cpu {report.get('cpu_s')} s, wall {report.get('wall_s')} s (limit {limit} s)"
    if _out_of_memory(report, test):
        return "memory_limit", f"peak {report.get('max_rss_bytes')} bytes (limit {test['memory_bytes']})"
    if report.get("output_limit"):
        return "wrong_answer", f"output over the limit ({report.get('stdout_bytes')} bytes)"
    if sig is not None:
        return "runtime_error", f"killed by signal {_signal_name(sig)}"
    kind = test["kind"]
    if kind == "stdio":
        if report.get("exit_code") != 0:
            return "runtime_error", f"exit code {report.get('exit_code')}: {_last_line(report)}"
        if tokens_match(report.get("stdout", ""), test["output"], float_tolerance):
            return "passed", ""
        return "wrong_answer", f"expected {_short(test['output'])}, got {_short(report.get('stdout', ''))}"
    result = report.get("result")
    if not isinstance(result, dict):
        return "runtime_error", f"no result (exit code {report.get('exit_code')}): {_last_line(report)}"
    if not result.get("ok"):
        error = f"{result.get('error')}: {result.get('message')}"
        if kind == "pytest" and result.get("error") == "AssertionError":
            return "wrong_answer", error
        return "runtime_error", error
    if kind == "call":
        if values_match(result.get("value"), test["output"], float_tolerance):
            return "passed", ""
        return "wrong_answer", f"expected {_short(repr(test['output']))}, got {_short(repr(result.get('value')))}"
    if report.get("nonce_ok") and report.get("exit_code") == 0:
        return "passed", ""
    return "wrong_answer", "the test did not report success"


def _out_of_memory(report: dict[str, Any], test: dict[str, Any]) -> bool:
    if "MemoryError" in (report.get("stderr_tail") or ""):
        return True
    result = report.get("result")
    if isinstance(result, dict) and result.get("error") == "MemoryError":
        return True
    # a C extension that cannot map memory dies of a signal or an abort, not a MemoryError
    failed = report.get("signal") is not None or report.get("exit_code") not in (0, None)
    return failed and report.get("max_rss_bytes", 0) >= MEMORY_NEAR_LIMIT * test["memory_bytes"]


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return str(number)


def _last_line(report: dict[str, Any]) -> str:
    lines = (report.get("stderr_tail") or "").strip().splitlines()
    return lines[-1][:300] if lines else "(no error output)"


def _short(text: str, limit: int = 120) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit] + "..."


def summarize(verdicts: list[str]) -> dict[str, Any]:
    """Reward (1.0 only when every test passed), fraction passed and counts per verdict."""
    passed = verdicts.count("passed")
    total = len(verdicts)
    return {"reward": 1.0 if total and passed == total else 0.0,
            "passed": passed, "total": total, "fraction_passed": passed / total if total else 0.0,
            "counts": {name: verdicts.count(name) for name in VERDICTS if name in verdicts}}
