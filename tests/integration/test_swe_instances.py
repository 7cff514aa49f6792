"""The swe task: instance shapes, shipped data, grading, and EVAL in a real sandbox.

The sandbox tests call the handler directly (no LLM, no service) in a real bubblewrap sandbox
with the shipped bundles bound read-only, as the pipeline does; one sandbox serves a whole test
because every evaluation clones the repository afresh.
"""
from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from handlers import JobContext, get_handler, registry
from handlers.sandbox_files import read_bytes, write_bytes
from handlers.swe import SweHandler, load_instances, normalize_instance
from handlers.swe.evaluation import files_of_tests, grade, parse_junit, patch_paths
from handlers.swe.handler import BUNDLE_MOUNT
from handlers.swe.instances import MAX_ITERATIONS_CAP, REPOS_ENV, SHIPPED_REPOS
from prorl_celery.core.settings import get_settings
from singularity.runtime import Bind, BubblewrapRuntime, FileAddressAllocator, FileSandboxLedger, SandboxSpec

ROOT = Path(__file__).resolve().parents[2]
BUILDER = ROOT / "handlers" / "swe" / "data" / "build_instances.py"
INSTANCES = load_instances()
BY_ID = {row["instance_id"]: row for row in INSTANCES}


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def verl_row(row: dict[str, Any], **changes: Any) -> dict[str, Any]:
    return {"data_source": "swe_gym", "prompt": [{"role": "user", "content": row["problem_statement"]}],
            "reward_model": {"style": "rule", "ground_truth": row["patch"]},
            "extra_info": {k: v for k, v in row.items() if k != "patch"}, **changes}


# --- instance shapes --------------------------------------------------------------------------

def test_swe_bench_row_with_json_string_test_lists() -> None:
    row = INSTANCES[0]
    assert isinstance(row["FAIL_TO_PASS"], str)  # as SWE-bench stores them
    instance = normalize_instance(row)
    assert instance.fail_to_pass == json.loads(row["FAIL_TO_PASS"])
    assert instance.pass_to_pass == json.loads(row["PASS_TO_PASS"])
    assert instance.bundle == (SHIPPED_REPOS / f"{instance.name}.bundle").resolve()
    messages = instance.messages()
    assert [m["role"] for m in messages] == ["system", "user"]
    assert row["problem_statement"].strip() in messages[1]["content"]
    assert row["patch"] not in json.dumps(messages) and row["test_patch"] not in json.dumps(messages)


def test_lists_are_accepted_too() -> None:
    row = {**INSTANCES[0], "FAIL_TO_PASS": ["tests/test_a.py::test_x"], "PASS_TO_PASS": []}
    assert normalize_instance(row).fail_to_pass == ["tests/test_a.py::test_x"]


def test_verl_row_reads_the_swe_fields_from_extra_info() -> None:
    row = INSTANCES[1]
    instance = normalize_instance(verl_row(row))
    assert instance.instance_id == row["instance_id"] and instance.base_commit == row["base_commit"]
    assert instance.messages() == [{"role": "user", "content": row["problem_statement"]}]
    assert instance.metadata["data_source"] == "swe_gym"


def test_shipped_verl_rows_are_the_same_instances() -> None:
    verl = load_instances(ROOT / "handlers" / "swe" / "data" / "verl_sample.jsonl")
    assert len(verl) == len(INSTANCES)
    for row, plain in zip(verl, INSTANCES):
        instance, expected = normalize_instance(row), normalize_instance(plain)
        assert (instance.instance_id, instance.base_commit, instance.fail_to_pass, instance.test_env) == \
            (expected.instance_id, expected.base_commit, expected.fail_to_pass, expected.test_env)
        assert instance.messages() == expected.messages() and instance.gold_patch is None
        assert get_handler(row["data_source"]).name == "swe"


def test_verl_row_with_the_instance_as_ground_truth() -> None:
    row = INSTANCES[2]
    instance = normalize_instance({"prompt": [{"role": "user", "content": "fix it"}],
                                   "reward_model": {"style": "rule", "ground_truth": json.dumps(row)}})
    assert instance.test_patch == row["test_patch"] and instance.gold_patch == row["patch"]


@pytest.mark.parametrize(("change", "message"), [
    ({"instance_id": None}, "'instance_id' is missing"),
    ({"repo": "a/b/c"}, "'repo'"),
    ({"repo": "nobody/not-shipped"}, "no git bundle for 'nobody/not-shipped'"),
    ({"base_commit": "main"}, "'base_commit'"),
    ({"problem_statement": "  "}, "'problem_statement'"),
    ({"test_patch": 3}, "'test_patch'"),
    ({"patch": ["x"]}, "'patch'"),
    ({"FAIL_TO_PASS": "[not json"}, "'FAIL_TO_PASS'"),
    ({"FAIL_TO_PASS": "[]"}, "'FAIL_TO_PASS' must name at least one test"),
    ({"FAIL_TO_PASS": ["../../etc/x.py::t"]}, "'FAIL_TO_PASS'"),
    ({"PASS_TO_PASS": [1]}, "'PASS_TO_PASS'"),
    ({"max_iterations": 0}, "'max_iterations'"),
    ({"eval_timeout_s": 0}, "'eval_timeout_s'"),
    ({"test_env": {"BAD NAME": "1"}}, "'test_env'"),
])
def test_invalid_instances_name_the_field(change: dict[str, Any], message: str) -> None:
    row = {**INSTANCES[0], **change}
    with pytest.raises(ValueError) as raised:
        SweHandler().validate_instance(row)
    assert message in str(raised.value)


@pytest.mark.parametrize(("row", "message"), [
    ({"prompt": [], "extra_info": {}}, "'prompt'"),
    ({"prompt": [{"role": "user", "content": "x"}], "extra_info": {}}, "'extra_info.instance_id' is missing"),
    ({"prompt": [{"role": "user", "content": "x"}], "reward_model": {"style": "model"}}, "'reward_model.style'"),
    ({"prompt": [{"role": "user", "content": "x"}], "extra_info": "x"}, "'extra_info'"),
])
def test_invalid_verl_rows_name_the_field(row: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError) as raised:
        SweHandler().validate_instance(row)
    assert message in str(raised.value)


def test_max_iterations_is_capped() -> None:
    assert normalize_instance({**INSTANCES[0], "max_iterations": 10**6}).max_iterations == MAX_ITERATIONS_CAP


def test_extra_bundle_directories(tmp_path, monkeypatch, request) -> None:
    """PRORL_SWE_REPOS reaches the handler as its configuration, never through the settings."""
    (tmp_path / "acme__widgets.bundle").write_bytes(b"")
    monkeypatch.setenv(REPOS_ENV, str(tmp_path))
    get_settings.cache_clear()  # settings are read once per process: read them again with the variable
    request.addfinalizer(get_settings.cache_clear)
    request.addfinalizer(lambda: registry.configure(""))
    with pytest.raises(ValueError, match="acme"):  # not configured yet: only the shipped bundles
        normalize_instance({**INSTANCES[0], "repo": "acme/widgets"})
    settings = get_settings()
    registry.configure(settings.handlers, **settings.handler_options())  # as a worker or the gateway does
    assert normalize_instance({**INSTANCES[0], "repo": "acme/widgets"}).bundle == tmp_path / "acme__widgets.bundle"


def test_registered_under_its_aliases() -> None:
    for name in ("swe", "swe_bench", "swebench", "swe_gym", "r2e"):
        assert isinstance(get_handler(name), SweHandler)


# --- grading ----------------------------------------------------------------------------------

def test_grade_follows_swe_bench() -> None:
    statuses = {"t::a": "passed", "t::b": "failed", "t::c": "xfailed", "t::d": "skipped", "t::e": "error"}
    assert grade(statuses, ["t::a", "t::c"], ["t::a", "t::d"]) == (True, {
        "FAIL_TO_PASS": {"success": ["t::a", "t::c"], "failure": []},
        "PASS_TO_PASS": {"success": ["t::a"], "failure": []}})
    resolved, report = grade(statuses, ["t::a", "t::d", "t::missing"], ["t::b", "t::e"])
    assert not resolved
    assert report["FAIL_TO_PASS"] == {"success": ["t::a"], "failure": ["t::d", "t::missing"]}  # a skip is no fix
    assert report["PASS_TO_PASS"] == {"success": [], "failure": ["t::b", "t::e"]}


def test_junit_node_ids_from_a_real_pytest_run(tmp_path) -> None:
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_mix.py").write_text(textwrap.dedent("""
        import pytest

        def test_ok(): pass
        def test_bad(): assert False
        @pytest.mark.parametrize("x", [1, "a b"])
        def test_param(x): pass
        @pytest.mark.skip(reason="no")
        def test_skip(): pass
        @pytest.mark.xfail
        def test_xfail(): assert False
        class TestGroup:
            class TestInner:
                def test_deep(self): pass
        @pytest.fixture
        def broken(): raise RuntimeError
        def test_error(broken): pass
    """))
    junit = tmp_path / "junit.xml"
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "junit_family=xunit1",
                    f"--junitxml={junit}", "tests/test_mix.py"], cwd=tmp_path, capture_output=True, timeout=120,
                   env={**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"})
    f = "tests/test_mix.py"
    assert parse_junit(junit.read_text()) == {
        f"{f}::test_ok": "passed", f"{f}::test_bad": "failed", f"{f}::test_param[1]": "passed",
        f"{f}::test_param[a b]": "passed", f"{f}::test_skip": "skipped", f"{f}::test_xfail": "xfailed",
        f"{f}::TestGroup::TestInner::test_deep": "passed", f"{f}::test_error": "error"}


def test_patch_paths_and_test_files() -> None:
    row = BY_ID["prorl-swe__dialects-41"]
    assert patch_paths(row["test_patch"]) == ["tests/test_reader.py", "tests/test_sniffer.py"]
    assert files_of_tests(["a.py::x", "b.py::y[1]", "a.py::z"]) == ["a.py", "b.py"]


# --- shipped data -----------------------------------------------------------------------------

def test_shipped_instances() -> None:
    assert len(INSTANCES) >= 8
    assert len({row["repo"] for row in INSTANCES}) == len(INSTANCES)
    for row in INSTANCES:
        instance = normalize_instance(row)
        assert instance.fail_to_pass and instance.pass_to_pass, row["instance_id"]
        assert set(files_of_tests(instance.fail_to_pass)) <= set(patch_paths(row["test_patch"]))
        # the base commit is a real commit of the bundle: its HEAD, with history behind it
        heads = subprocess.run(["git", "bundle", "list-heads", str(instance.bundle)], capture_output=True,
                               text=True, check=True).stdout
        assert f"{instance.base_commit} HEAD" in heads, row["instance_id"]
        assert instance.bundle.stat().st_size < 64 * 1024


def test_shipped_data_is_reproducible_from_sources() -> None:
    done = subprocess.run([sys.executable, str(BUILDER), "--check"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr


def test_shipped_data_can_be_submitted() -> None:
    from prorl_celery.trainer.submit import read_rows  # the rows `prorl submit` would post
    rows = list(read_rows(ROOT / "handlers" / "swe" / "data" / "instances.jsonl"))
    assert [row["instance_id"] for row in rows] == [row["instance_id"] for row in INSTANCES]


# --- EVAL in a real sandbox -------------------------------------------------------------------

class Sandbox:
    """One real bubblewrap sandbox with the shipped bundles bound where the handler expects them."""

    def __init__(self, tmp: Path) -> None:
        self.runtime = BubblewrapRuntime(ledger=FileSandboxLedger(tmp / "ledger"),
                                         allocator=FileAddressAllocator(tmp / "leases.json"), node="swe-test")
        self.spec = SandboxSpec(image="dev", workspace=tmp / "ws", job_id="swe-test",
                                binds=(Bind(source=str(SHIPPED_REPOS), target=BUNDLE_MOUNT),))

    async def __aenter__(self):
        self.sandbox = await self.runtime.start(self.spec)
        self.client = self.sandbox.client()
        return await self.client.__aenter__()

    async def __aexit__(self, *exc: object) -> None:
        await self.client.__aexit__(*exc)
        await self.sandbox.stop()


@pytest.fixture
def sandbox_dir(tmp_path) -> Path:
    if not BubblewrapRuntime().available():
        pytest.fail(f"bubblewrap must work here: {BubblewrapRuntime().available().reason}")
    return tmp_path


def make_patch(row: dict[str, Any], path: str, old: str, new: str, tmp: Path) -> str:
    """A patch made with git on the host: ``old`` replaced by ``new`` in ``path`` at base_commit."""
    repo = tmp / "patch-repo"
    subprocess.run(["git", "clone", "-q", str(normalize_instance(row).bundle), str(repo)], check=True)
    subprocess.run(["git", "checkout", "-q", row["base_commit"]], cwd=repo, check=True)
    text = (repo / path).read_text()
    assert text.count(old) == 1
    (repo / path).write_text(text.replace(old, new))
    return subprocess.run(["git", "diff"], cwd=repo, capture_output=True, text=True, check=True).stdout


async def evaluate(client: Any, row: dict[str, Any], patch: str) -> Any:
    job = JobContext(job_id="e", task="swe", instance=row, run_result={"patch": patch}, sandbox=client)
    return await SweHandler().eval(job)


#: the instance the default run judges (the agent tests' too); the other shipped ones, the same
#: code paths on other repositories' data, are judged by ``-m extended`` (seconds each)
DEFAULT_INSTANCE = "prorl-swe__romanum-14"


@pytest.mark.parametrize("instance_id", [
    pytest.param(row["instance_id"], marks=() if row["instance_id"] == DEFAULT_INSTANCE else (pytest.mark.extended,))
    for row in INSTANCES])
def test_gold_patch_resolves_and_empty_patch_does_not(sandbox_dir, instance_id: str) -> None:
    """Every shipped instance: the gold patch makes every FAIL_TO_PASS test pass and keeps every
    PASS_TO_PASS test passing; without a patch every FAIL_TO_PASS test fails and every
    PASS_TO_PASS test passes (so each listed test really is what its list says)."""
    row = BY_ID[instance_id]

    async def body() -> None:
        async with Sandbox(sandbox_dir) as client:
            f2p, p2p = json.loads(row["FAIL_TO_PASS"]), json.loads(row["PASS_TO_PASS"])
            gold = await evaluate(client, row, row["patch"])
            assert (gold.reward, gold.details["resolved"], gold.details["patch_applied"]) == (1.0, True, True), \
                (row["instance_id"], gold.details)
            assert gold.details["report"] == {"FAIL_TO_PASS": {"success": f2p, "failure": []},
                                              "PASS_TO_PASS": {"success": p2p, "failure": []}}
            empty = await evaluate(client, row, "")
            assert (empty.reward, empty.details["resolved"]) == (0.0, False), row["instance_id"]
            assert empty.details["reason"] == "empty patch"
            assert empty.details["report"]["FAIL_TO_PASS"]["failure"] == f2p, row["instance_id"]
            assert empty.details["report"]["PASS_TO_PASS"]["failure"] == [], row["instance_id"]
            assert set(empty.details["tests"].values()) <= {"passed", "failed", "error"}
    run(body())


def test_bad_patches_and_edited_tests(sandbox_dir) -> None:
    row = BY_ID["prorl-swe__romanum-14"]
    gold = row["patch"]

    async def body() -> None:
        async with Sandbox(sandbox_dir) as client:
            garbage = await evaluate(client, row, gold.replace(' (1000, "M"),', ' (1000, "MM"),'))
            assert garbage.reward == 0.0 and not garbage.details["patch_applied"]
            assert garbage.details["reason"].startswith("the model patch does not apply")
            # an agent that "fixes" the tests instead: the test patch's files are restored first
            cheat = ("diff --git a/tests/test_numerals.py b/tests/test_numerals.py\n--- a/tests/test_numerals.py\n"
                     "+++ b/tests/test_numerals.py\n@@ -1,3 +1,3 @@\n-import pytest\n+import pytest  # edited\n \n"
                     " from romanum import RomanError, from_roman, is_roman, to_roman\n")
            both = await evaluate(client, row, gold + cheat)
            assert both.reward == 1.0 and both.details["patch_applied"], both.details
            only_cheat = await evaluate(client, row, cheat)
            assert only_cheat.reward == 0.0 and only_cheat.details["patch_applied"]
            # a patch whose code hangs: the time limit ends the run, the reward is 0
            hang = make_patch(row, "romanum/numerals.py", "    parts = []\n",
                              "    __import__('time').sleep(999)\n    parts = []\n", sandbox_dir)
            slow = await evaluate(client, {**row, "eval_timeout_s": 5}, hang)
            assert slow.reward == 0.0 and "did not finish within 5 s" in slow.details["reason"], slow.details
    run(body())


def test_files_move_byte_exact(sandbox_dir) -> None:
    data = bytes(range(256)) * 300 + b"\r\nno final newline"  # several pages, every byte value

    async def body() -> None:
        async with Sandbox(sandbox_dir) as client:
            await write_bytes(client, "/workspace/x/blob.bin", data)
            assert await read_bytes(client, "/workspace/x/blob.bin") == data
            assert await read_bytes(client, "/workspace/x/none") is None
            with pytest.raises(ValueError):
                await read_bytes(client, "/workspace/x/blob.bin", limit_bytes=100)
    run(body())


class FailingLLM:
    """A ChatLLM that plays scripted turns, then fails like a backend that went away."""

    def __init__(self, replies: list[str]) -> None:
        self.replies, self.turns, self._messages = list(replies), 0, []

    def start(self, messages, tools=None) -> None:
        self._messages = list(messages)
        self.tools = tools

    async def generate(self, **overrides):
        from handlers import Generation
        if not self.replies:
            raise ConnectionError("backend went away")
        text = self.replies.pop(0)
        self.turns += 1
        self._messages.append({"role": "assistant", "content": text})
        return Generation(text=text, token_ids=[1], logprobs=[0.0], finish_reason="stop")

    def add_message(self, role, content, **fields) -> None:
        self._messages.append({"role": role, "content": content})

    def note_action(self, name, arguments) -> None:
        pass

    @property
    def messages(self):
        return self._messages

    @property
    def num_turns(self):
        return self.turns

    @property
    def context_left(self):
        return 10**6


def test_init_checks_out_base_commit_and_a_failed_run_keeps_its_patch(sandbox_dir) -> None:
    row = BY_ID["prorl-swe__romanum-14"]
    handler = SweHandler()

    def call(name: str, **arguments: Any) -> str:
        return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"

    edit = call("editor", command="str_replace", path="romanum/romanum/numerals.py",
                old_str='    (1000, "M"),\n', new_str='    (1000, "M"),\n    (900, "CM"),\n')
    notes = call("bash", command="printf 'why CM\\n' > NOTES.txt && mkdir -p __pycache__ && touch __pycache__/x.pyc")

    async def body() -> None:
        async with Sandbox(sandbox_dir) as client:
            job = JobContext(job_id="j", task="swe", instance=row, sandbox=client)
            job.init_result = await handler.init(job)
            state = (await client.bash("pwd; git rev-parse HEAD; git remote | wc -l; git rev-list --count HEAD; "
                                       "git status --porcelain | wc -l")).output.split()
            assert state == ["/workspace/romanum", row["base_commit"], "0", "2", "0"]
            llm = FailingLLM([edit, notes])
            with pytest.raises(ConnectionError) as raised:
                await handler.run(job, llm)
            assert llm.tools and {t["function"]["name"] for t in llm.tools} == {"bash", "editor", "finish"}
            job.run_result = await handler.run_exception(job, raised.value)
            patch = job.run_result["patch"]
            assert job.run_result["finish_reason"] == "error" and "backend went away" in job.run_result["error"]
            assert patch.startswith("diff --git a/NOTES.txt b/NOTES.txt") and '+    (900, "CM"),' in patch
            assert "__pycache__" not in patch  # ignored by the repository's .gitignore
            assert handler.final_result(job) == {"artifacts": {"patch": patch}, "git_patch": patch}
            result = await handler.eval(job)
            assert result.reward == 1.0, result.details
    run(body())
