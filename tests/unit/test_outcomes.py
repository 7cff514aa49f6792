"""The outcome classes: which failure is whose, and what a result says of each (no process)."""
from __future__ import annotations

import importlib.metadata
import sys

import pytest
import redis

from handlers import load_handlers
from handlers.sandbox_tools import BASH, EDITOR, PYTHON, SEARCH
from prorl_celery.core.errors import (
    AgentFailure,
    BackendError,
    ContextExhausted,
    EnvironmentFailure,
    EvalUnavailable,
    JobCancelled,
    RequirementMissing,
    StageTimeout,
)
from prorl_celery.core.outcomes import Outcome, classify, of_status
from prorl_celery.core.status import JobStatus, Stage
from prorl_celery.state.store import JobRecord
from prorl_celery.wire.results import ending_of
from singularity import requirements
from singularity.runtime.errors import SandboxStartError
from singularity.toolserver.errors import ToolServerGone


@pytest.mark.parametrize(("stage", "error", "expected"), [
    (Stage.RUN, ContextExhausted("full"), Outcome.AGENT_ERROR),  # a BackendError, but the policy's own
    (Stage.RUN, AgentFailure("no such action"), Outcome.AGENT_ERROR),
    (Stage.RUN, BackendError("answered 500", status_code=500), Outcome.BACKEND_ERROR),
    (Stage.RUN, BackendError("unreachable"), Outcome.BACKEND_ERROR),
    (Stage.RUN, ToolServerGone("server_gone", "cannot connect"), Outcome.ENV_ERROR),
    (Stage.INIT, SandboxStartError("bwrap failed"), Outcome.ENV_ERROR),
    (Stage.INIT, redis.ConnectionError("restarting"), Outcome.ENV_ERROR),
    (Stage.INIT, RequirementMissing("no ipykernel"), Outcome.ENV_ERROR),
    (Stage.RUN, KeyError("a handler bug"), Outcome.ENV_ERROR),
    (Stage.EVAL, EvalUnavailable("no report"), Outcome.EVAL_ERROR),
    (Stage.EVAL, RequirementMissing("no pytest"), Outcome.EVAL_ERROR),  # an evaluator's requirement
    (Stage.EVAL, ZeroDivisionError("a grader bug"), Outcome.EVAL_ERROR),
    (Stage.EVAL, EnvironmentFailure("the judge's sandbox"), Outcome.EVAL_ERROR),
    (Stage.RUN, StageTimeout("budget"), Outcome.TIMEOUT),
    (Stage.RUN, JobCancelled("cancelled"), Outcome.CANCELLED),
])
def test_each_failure_has_one_class(stage, error, expected):
    ending = classify(stage, error)
    assert (ending.outcome, ending.stage) == (expected, stage.value)
    assert type(error).__name__ in ending.detail


def test_only_the_policy_s_own_classes_carry_a_reward_and_only_others_are_retried():
    assert {o for o in Outcome if o.reward_valid} == {Outcome.OK, Outcome.AGENT_ERROR}
    assert {o for o in Outcome if o.retryable} == {Outcome.ENV_ERROR, Outcome.BACKEND_ERROR, Outcome.EVAL_ERROR}
    assert "HTTP 503" in classify(Stage.RUN, BackendError("down", status_code=503)).detail


def test_a_record_from_before_outcomes_reads_its_class_from_its_status():
    def record(status: JobStatus, **fields) -> JobRecord:
        return JobRecord(id="j", status=status, **fields)
    assert ending_of(record(JobStatus.COMPLETED, reward=1.0)).outcome is Outcome.OK
    assert ending_of(record(JobStatus.FAILED, critical_error="eval")).outcome is Outcome.EVAL_ERROR
    assert ending_of(record(JobStatus.FAILED, critical_error="init")).stage == "init"
    assert ending_of(record(JobStatus.TIMEOUT, critical_error="timeout")).stage is None
    assert of_status(JobStatus.CANCELLED) is Outcome.CANCELLED
    recorded = record(JobStatus.FAILED, outcome="backend_error", outcome_stage="run", detail="answered 500")
    assert (ending_of(recorded).outcome, ending_of(recorded).detail) == (Outcome.BACKEND_ERROR, "answered 500")


# -- requirements: one list, declared and checked ------------------------------------------------

def _installed_requirements() -> set[str]:
    """Distribution names the installed project requires without an extra (its base install)."""
    names = set()
    for line in importlib.metadata.requires("prorl-celery") or []:
        if "extra ==" not in line:
            names.add(requirements.distribution(line))
    return names


def test_the_base_install_carries_the_one_sandbox_list():
    base = _installed_requirements()
    sandbox = [requirements.distribution(spec) for spec in requirements.sandbox_pip()]
    assert {"pytest", "ipykernel", "bm25s", "ptyprocess"} <= set(sandbox)
    assert set(sandbox) <= base, f"the base install lacks {set(sandbox) - base}"
    extra = {requirements.distribution(line.split(";")[0]) for line in importlib.metadata.requires("prorl-celery")
             if 'extra == "sandbox"' in line}
    assert extra == set(sandbox)  # the sandbox extra is the list itself


def test_every_declared_python_requirement_is_in_the_base_install():
    base = _installed_requirements()
    declared = [r for handler in load_handlers().values() for r in handler.requires]
    declared += [r for tool in (PYTHON, BASH, EDITOR, SEARCH) for r in tool.requires]
    python = {r.name for r in declared if r.kind == "python"}
    assert python and python <= base, f"declared but not installed by the base install: {python - base}"
    assert {r.name for r in load_handlers()["swe"].requires} >= {"pytest", "git"}
    assert "ipykernel" in {r.name for r in load_handlers()["math"].requires}


def test_a_module_that_cannot_be_imported_is_missing_and_named_with_its_fix(monkeypatch):
    class Blocker:
        """A finder first on the path that refuses one module, as a broken install would."""

        def find_spec(self, name, path=None, target=None):
            if name == "pytest":
                raise ModuleNotFoundError("No module named 'pytest'")
            return None

    monkeypatch.setattr(sys, "meta_path", [Blocker(), *sys.meta_path])
    monkeypatch.delitem(sys.modules, "pytest")  # imported here (not in a worker): find_spec would not look
    needed = (requirements.PYTEST, requirements.GIT, requirements.IPYKERNEL)
    assert requirements.missing(needed, "eval") == [requirements.PYTEST]  # ipykernel: not EVAL's
    assert requirements.missing(needed, "init") == []  # pytest: EVAL's alone
    assert requirements.missing((requirements.program("no-such-program-here"),)) != []
    line = requirements.explain("swe", [requirements.PYTEST])
    assert "'swe'" in line and "pytest" in line and "base install" in line
