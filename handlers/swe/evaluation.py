"""Pure parts of SWE evaluation: which tests to run, reading pytest's JUnit XML, the report.

Grading follows SWE-bench (``swebench.harness.grading``): a test counts as a success when it
passed (or xfailed), as a failure when it failed, errored or did not run at all; an instance is
resolved when every FAIL_TO_PASS and every PASS_TO_PASS test is a success. One deliberate
difference: SWE-bench drops skipped tests from the report, so a patch that makes a
FAIL_TO_PASS test skip itself would count as resolved; here a skipped FAIL_TO_PASS test is a
failure (a skipped PASS_TO_PASS test is still ignored, as skips there are usually the
environment's doing).
"""
from __future__ import annotations

import re
import shlex
import xml.etree.ElementTree as ElementTree
from collections.abc import Iterable
from typing import Any

PASSED, FAILED, ERROR, SKIPPED, XFAILED, MISSING = "passed", "failed", "error", "skipped", "xfailed", "missing"
SUCCESS_STATUSES = frozenset({PASSED, XFAILED})

_PATCH_PATH = re.compile(r"^(?:---|\+\+\+) (?:a|b)/(.+?)(?:\t.*)?$", re.MULTILINE)


def file_of_test(node_id: str) -> str:
    """The file part of a pytest node id (``tests/test_x.py::Test::test_y[1]`` -> ``tests/test_x.py``)."""
    return node_id.split("::", 1)[0]


def files_of_tests(node_ids: Iterable[str]) -> list[str]:
    """The distinct test files of ``node_ids``, in first-seen order (what pytest is run on)."""
    return list(dict.fromkeys(file_of_test(node_id) for node_id in node_ids))


def patch_paths(patch: str) -> list[str]:
    """Paths a unified diff touches (old and new names), in first-seen order."""
    return list(dict.fromkeys(match.group(1) for match in _PATCH_PATH.finditer(patch)))


def pytest_command(files: list[str], junit_path: str, log_path: str, timeout_s: float,
                   env: dict[str, str] | None = None) -> str:
    """The shell command that runs ``files`` under a wall-clock limit, JUnit XML to ``junit_path``.

    ``xunit1`` keeps the ``file`` attribute on each test case, which node ids are rebuilt from.
    ``timeout`` sends SIGTERM at the limit and SIGKILL 5 s later (exit status 124 or 137).
    """
    arguments = " ".join(shlex.quote(f) for f in files)
    variables = " ".join(f"{name}={shlex.quote(value)}" for name, value in (env or {}).items())
    return (f"{variables} PYTHONDONTWRITEBYTECODE=1 timeout -k 5 {int(timeout_s)} python -m pytest -p no:cacheprovider "
            f"-o junit_family=xunit1 --junitxml={shlex.quote(junit_path)} -rA {arguments} "
            f"> {shlex.quote(log_path)} 2>&1; echo \"exit=$?\"")


def parse_junit(xml_text: str) -> dict[str, str]:
    """Node id -> status for every test case of a pytest JUnit XML report (xunit1 family).

    A test with a failing teardown appears with a result and an error; the worse one wins.
    """
    root = ElementTree.fromstring(xml_text)
    statuses: dict[str, str] = {}
    rank = {PASSED: 0, XFAILED: 0, SKIPPED: 1, FAILED: 2, ERROR: 3}
    for case in root.iter("testcase"):
        node_id = _node_id(case)
        if node_id is None:
            continue
        status = _status(case)
        if node_id not in statuses or rank[status] > rank[statuses[node_id]]:
            statuses[node_id] = status
    return statuses


def _node_id(case: ElementTree.Element) -> str | None:
    name, classname, file = case.get("name"), case.get("classname") or "", case.get("file")
    if not name:
        return None
    if not file:  # a collection error of a whole module has no file: it is not a test
        return None
    module = file[:-3].replace("/", ".") if file.endswith(".py") else file.replace("/", ".")
    if classname == module:
        return f"{file}::{name}"
    if classname.startswith(module + "."):
        classes = classname[len(module) + 1:].split(".")
        return "::".join([file, *classes, name])
    return f"{file}::{name}"


def _status(case: ElementTree.Element) -> str:
    if case.find("error") is not None:
        return ERROR
    if case.find("failure") is not None:
        return FAILED
    skipped = case.find("skipped")
    if skipped is not None:
        return XFAILED if skipped.get("type") == "pytest.xfail" else SKIPPED
    return PASSED


def grade(statuses: dict[str, str], fail_to_pass: list[str],
          pass_to_pass: list[str]) -> tuple[bool, dict[str, dict[str, list[str]]]]:
    """(resolved, SWE-bench style report) from per-test statuses.

    The report is ``{"FAIL_TO_PASS": {"success": [...], "failure": [...]}, "PASS_TO_PASS": ...}``;
    skipped PASS_TO_PASS tests are in neither list (see the module docstring).
    """
    report: dict[str, dict[str, list[str]]] = {}
    for group, tests, skip_ok in (("FAIL_TO_PASS", fail_to_pass, False), ("PASS_TO_PASS", pass_to_pass, True)):
        success, failure = [], []
        for test in tests:
            status = statuses.get(test, MISSING)
            if status in SUCCESS_STATUSES:
                success.append(test)
            elif status == SKIPPED and skip_ok:
                continue
            else:
                failure.append(test)
        report[group] = {"success": success, "failure": failure}
    resolved = not report["FAIL_TO_PASS"]["failure"] and not report["PASS_TO_PASS"]["failure"]
    return resolved, report


def statuses_of(statuses: dict[str, str], tests: Iterable[str]) -> dict[str, Any]:
    """The status of each listed test (``missing`` when it did not run)."""
    return {test: statuses.get(test, MISSING) for test in tests}
