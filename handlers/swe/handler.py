"""SweHandler: fix a repository's issue with bash and an editor; graded by its hidden tests.

INIT clones the instance's git bundle (bound read-only into the sandbox) into
``/workspace/<name>`` at ``base_commit``; RUN is the shared agent loop with the ``bash``,
``editor`` and ``finish`` tools, and ends by taking ``git diff`` of the workspace against
``base_commit`` (new files included) as the model patch; EVAL, in a fresh sandbox, clones the
repository again, applies the model patch, restores the files the test patch touches, applies
the test patch and runs the FAIL_TO_PASS and PASS_TO_PASS tests under a time limit (see
``evaluation`` for the grading rules).
"""
from __future__ import annotations

import re
import shlex
from typing import Any, ClassVar

from handlers.agent import AgentLoop
from handlers.base import AgentHandler, ChatLLM, EvalResult, JobContext, SandboxRequest
from handlers.sandbox_files import SandboxCommandError, read_bytes, sh, write_bytes
from handlers.sandbox_tools import BASH, EDITOR
from handlers.swe.evaluation import files_of_tests, grade, parse_junit, patch_paths, pytest_command, statuses_of
from handlers.swe.instances import SweInstance, normalize_instance
from prorl_celery.core.errors import EvalUnavailable
from singularity.requirements import GIT, PYTEST, TIMEOUT, Requirement

#: where the directory holding the instance's bundle appears inside the sandbox (read-only)
BUNDLE_MOUNT = "/data/swe/repos"
#: EVAL's scratch directory: next to the repository, never inside it
EVAL_DIR = "/workspace/.swe_eval"
#: a model patch larger than this is not kept (it would bloat the job record)
MAX_PATCH_BYTES = 2 * 2**20
#: patches are text, but a repository may hold non-UTF-8 files: keep their bytes exactly
PATCH_ENCODING = ("utf-8", "surrogateescape")
#: git settings that the agent's repository configuration must not change for diff and apply
_GIT = ("git -c core.quotepath=false -c diff.noprefix=false -c diff.mnemonicPrefix=false "
        "-c core.autocrlf=false -c color.ui=never")


def checkout_command(instance: SweInstance) -> str:
    """Clone the bundle into the workspace at ``base_commit``; the shell is left in the clone."""
    repo_dir, commit = shlex.quote(instance.repo_dir), shlex.quote(instance.base_commit)
    bundle = shlex.quote(f"{BUNDLE_MOUNT}/{instance.bundle.name}")
    return (f"cd /workspace && rm -rf {repo_dir} && git clone -q {bundle} {repo_dir} && cd {repo_dir} && "
            f"{{ git -c advice.detachedHead=false checkout -q {commit} 2>&1 || "
            f"{{ echo 'base_commit {instance.base_commit} is not in the bundle'; false; }}; }} && "
            f"git remote remove origin && git config user.name agent && "
            f"git config user.email agent@sandbox.invalid")


def diff_command(instance: SweInstance, out_path: str) -> str:
    """The model patch: every change against ``base_commit``, new files included (not ignored ones)."""
    repo_dir = shlex.quote(instance.repo_dir)
    return (f"{_GIT} -C {repo_dir} add -A && {_GIT} -C {repo_dir} diff --cached --binary --no-ext-diff "
            f"--no-color {shlex.quote(instance.base_commit)} > {shlex.quote(out_path)}")


class SweHandler(AgentHandler[ChatLLM]):
    """Task ``swe``: SWE-bench-format instances and verl rows carrying them."""

    name: ClassVar[str] = "swe"
    #: its tools answer the same actions alike on a fresh sandbox: a crashed RUN resumes by replay
    replayable_tools: ClassVar[bool] = True
    aliases: ClassVar[tuple[str, ...]] = ("swe_bench", "swebench", "swe-bench", "swe_gym", "swegym", "r2e", "r2e_gym")
    #: one tool call (a test run, say) may take this long in the sandbox
    tool_timeout_s: ClassVar[float] = 120.0
    requires: ClassVar[tuple[Requirement, ...]] = (*BASH.requires, *EDITOR.requires, GIT, PYTEST, TIMEOUT)

    def parse_instance(self, instance: dict[str, Any]) -> SweInstance:
        """The instance as a ``SweInstance``; ValueError names the missing or wrong field."""
        return normalize_instance(instance)

    def sandbox_request(self, job: JobContext) -> SandboxRequest:
        return self._sandbox(self.instance_of(job))

    def eval_sandbox_request(self, job: JobContext) -> SandboxRequest:
        """A fresh sandbox: the hidden tests never run where the agent worked."""
        return self._sandbox(self.instance_of(job))

    @staticmethod
    def _sandbox(instance: SweInstance) -> SandboxRequest:
        return SandboxRequest(binds=((str(instance.bundle.parent), BUNDLE_MOUNT),))

    async def init(self, job: JobContext) -> dict[str, Any]:
        """Check the repository out at ``base_commit``; returns the prompt and the limits."""
        instance: SweInstance = self.instance_of(job)
        await sh(job.sandbox, checkout_command(instance), timeout_s=120)
        return {"messages": instance.messages(), "repo_dir": instance.repo_dir,
                "base_commit": instance.base_commit, "max_iterations": instance.max_iterations,
                "metadata": {"instance_id": instance.instance_id, "repo": instance.repo, **instance.metadata}}

    async def run(self, job: JobContext, llm: ChatLLM) -> dict[str, Any]:
        """The agent loop, then the model patch (``patch``; ``patch_error`` when it could not be taken).

        When the loop itself fails (the LLM backend, say), the patch so far is still taken and
        handed to ``run_exception`` so EVAL grades what the agent did.
        """
        instance: SweInstance = self.instance_of(job)
        loop = AgentLoop(tools=[BASH, EDITOR], max_iterations=instance.max_iterations,
                         tool_timeout_s=self.tool_timeout_s)
        try:
            outcome = await loop.run(job, llm, instance.messages())
        except Exception as error:
            try:
                error.swe_patch = await self._take_patch(job, instance)  # type: ignore[attr-defined]
            except Exception:  # noqa: BLE001 - the sandbox may be gone too; the original error matters
                pass
            raise
        return {**outcome, **await self._take_patch(job, instance)}

    async def _take_patch(self, job: JobContext, instance: SweInstance) -> dict[str, Any]:
        out_path = "/tmp/swe_model.patch"  # the sandbox's private /tmp: outside the agent's repository
        try:
            await sh(job.sandbox, diff_command(instance, out_path), timeout_s=60)
            data = await read_bytes(job.sandbox, out_path, limit_bytes=MAX_PATCH_BYTES)
        except (SandboxCommandError, ValueError) as error:
            return {"patch": "", "patch_error": str(error)}
        return {"patch": (data or b"").decode(*PATCH_ENCODING)}

    async def run_exception(self, job: JobContext, error: BaseException) -> dict[str, Any]:
        """The patch taken before the failure, if any, so EVAL still grades it."""
        salvaged = getattr(error, "swe_patch", None) or {"patch": ""}
        return {"answer": None, "finish_reason": "error", "error": f"{type(error).__name__}: {error}", **salvaged}

    async def eval(self, job: JobContext) -> EvalResult:
        """Reward 1.0 when the model patch resolves the instance, else 0.0 (details say why)."""
        instance: SweInstance = self.instance_of(job)
        if job.sandbox is None:
            raise RuntimeError("EVAL needs its sandbox (eval_sandbox_request)")
        patch = job.run_result.get("patch") or ""
        details: dict[str, Any] = {"instance_id": instance.instance_id, "resolved": False, "patch_applied": False,
                                   "patch_bytes": len(patch.encode(*PATCH_ENCODING)), "reason": None}
        if job.run_result.get("patch_error"):
            details["patch_error"] = job.run_result["patch_error"]
        await sh(job.sandbox, checkout_command(instance), timeout_s=120)
        if patch.strip():
            problem = await self._apply(job.sandbox, instance, "model.patch", patch)
            if problem is not None:
                details["reason"] = f"the model patch does not apply: {problem}"
                return EvalResult(0.0, details)
            details["patch_applied"] = True
        else:
            details["reason"] = "empty patch"
        await self._restore_test_files(job.sandbox, instance)
        problem = await self._apply(job.sandbox, instance, "test.patch", instance.test_patch)
        if problem is not None:  # the instance's own patch: a broken instance, not a wrong answer
            raise EvalUnavailable(f"the instance's test_patch does not apply at base_commit: {problem}")
        statuses, run = await self._run_tests(job.sandbox, instance)
        if run.get("no_report"):
            await self._judgeable(job.sandbox, run, model_patched=bool(patch.strip()))
        resolved, report = grade(statuses, instance.fail_to_pass, instance.pass_to_pass)
        details.update(resolved=resolved, report=report, **run,
                       tests=statuses_of(statuses, [*instance.fail_to_pass, *instance.pass_to_pass]))
        if not resolved and details["reason"] is None:
            details["reason"] = run.get("problem") or (
                f"{len(report['FAIL_TO_PASS']['failure'])} FAIL_TO_PASS and "
                f"{len(report['PASS_TO_PASS']['failure'])} PASS_TO_PASS tests failed")
        return EvalResult(1.0 if resolved else 0.0, details)

    async def _apply(self, sandbox: Any, instance: SweInstance, name: str, patch: str) -> str | None:
        """Apply ``patch`` to the checkout; None, or git's complaint when it does not apply."""
        path = f"{EVAL_DIR}/{name}"
        await write_bytes(sandbox, path, patch.encode(*PATCH_ENCODING))
        result = await sandbox.bash(f"cd {shlex.quote(instance.repo_dir)} && {_GIT} apply --whitespace=nowarn "
                                    f"{shlex.quote(path)} 2>&1", timeout_s=60)
        if result.exit_code == 0 and not result.timed_out:
            return None
        return result.output.strip()[-2000:] or f"git apply exit code {result.exit_code}"

    async def _restore_test_files(self, sandbox: Any, instance: SweInstance) -> None:
        """Files the test patch touches go back to ``base_commit`` (as SWE-bench does), so an
        agent's edits to them neither block the test patch nor change the hidden tests."""
        commit = shlex.quote(instance.base_commit)
        commands = [f"if git cat-file -e {commit}:{shlex.quote(path)} 2>/dev/null; then "
                    f"git checkout -q {commit} -- {shlex.quote(path)}; else rm -rf {shlex.quote(path)}; fi"
                    for path in patch_paths(instance.test_patch)]
        if commands:
            await sh(sandbox, f"cd {shlex.quote(instance.repo_dir)} && " + " && ".join(commands))

    async def _run_tests(self, sandbox: Any, instance: SweInstance) -> tuple[dict[str, str], dict[str, Any]]:
        """Per-test statuses and what the run looked like (exit code, log tail, a problem)."""
        junit, log = f"{EVAL_DIR}/junit.xml", f"{EVAL_DIR}/pytest.log"
        files = files_of_tests([*instance.fail_to_pass, *instance.pass_to_pass])
        command = f"cd {shlex.quote(instance.repo_dir)} && rm -f {junit} && " + pytest_command(
            files, junit, log, instance.eval_timeout_s, instance.test_env)
        result = await sandbox.bash(command, timeout_s=instance.eval_timeout_s + 30)
        found = re.search(r"exit=(\d+)", result.output)
        exit_code = int(found.group(1)) if found else None
        tail = await sh(sandbox, f"tail -c 3000 {log} 2>/dev/null || true", check=False)
        run: dict[str, Any] = {"pytest_exit_code": exit_code, "log_tail": tail}
        if result.timed_out or exit_code in (124, 137):
            run["problem"] = f"the tests did not finish within {instance.eval_timeout_s:g} s"
        xml = await read_bytes(sandbox, junit)
        if xml is None:
            run.setdefault("problem", f"pytest wrote no report (exit code {exit_code})")
            run["no_report"] = True
            return {}, run
        try:
            return parse_junit(xml.decode("utf-8", "replace")), run
        except Exception as error:  # noqa: BLE001 - a patched conftest may garble the report
            run.setdefault("problem", f"the pytest report is unreadable: {error}")
            run["no_report"] = True
            return {}, run

    async def _judgeable(self, sandbox: Any, run: dict[str, Any], *, model_patched: bool) -> None:
        """The tests left no usable report: did they run at all? Raises ``EvalUnavailable``
        (never a reward of 0) when the test runner is missing, or when nothing the agent did can
        explain it (no model patch). A model patch that leaves pytest unable to report (a broken
        conftest, a hang) is the agent's doing, judged unresolved."""
        probe = await sandbox.bash("python -m pytest --version 2>&1; echo \"exit=$?\"", timeout_s=60)
        if not re.search(r"exit=0\s*$", probe.output):
            raise EvalUnavailable(f"the test runner is missing in the evaluation sandbox (python -m pytest: "
                                  f"{probe.output.strip().splitlines()[0] if probe.output.strip() else 'no output'}); "
                                  f"install the project's base install, which carries pytest")
        if not model_patched:
            raise EvalUnavailable(f"{run['problem']} with no model patch applied: the tests did not run; "
                                  f"log tail: {run.get('log_tail', '')[-300:]!r}")

    async def eval_exception(self, job: JobContext, error: BaseException) -> EvalResult:
        """What is known of the failed evaluation (its reward is never used)."""
        return EvalResult(0.0, {"instance_id": job.instance.get("instance_id"), "resolved": None,
                                "error": f"{type(error).__name__}: {error}"})

    def final_result(self, job: JobContext) -> dict[str, Any]:
        """The model patch is the job's artifact, and v1's ``git_patch``."""
        patch = job.run_result.get("patch", "")
        return {"artifacts": {"patch": patch}, "git_patch": patch}
