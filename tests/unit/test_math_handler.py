"""The math task: answer extraction, grading, instance shapes, shipped data, the RUN loop."""
from __future__ import annotations

import asyncio
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from handlers.base import ChatLLM, EvalResult, JobContext
from handlers.math import (
    FOLLOW_UP,
    MathHandler,
    extract_boxed,
    is_equivalent,
    load_samples,
    normalize_instance,
)
from handlers.math.grading import symbolic_check_refused
from handlers.math.instances import MAX_ITERATIONS_CAP, SHAPE_HINT
from handlers.noop import NoopHandler
from tests.support.scripted_llm import ScriptedLLM


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def rollout(instance: dict[str, Any], replies: list[str], **llm_options: Any):
    """init -> run -> eval, as the pipeline chains them; returns (job, llm, eval result)."""
    handler = MathHandler()
    handler.validate_instance(instance)
    job = JobContext(job_id="j1", task="math", instance=instance)
    job.init_result = run(handler.init(job))
    llm = ScriptedLLM(replies, **llm_options)
    job.run_result = run(handler.run(job, llm))
    return job, llm, run(handler.eval(job))


def perturb(answer: str) -> str:
    """Change the last digit of an answer, which makes every shipped answer wrong."""
    digits = list(re.finditer(r"\d", answer))
    assert digits, f"shipped answer {answer!r} has no digit to perturb"
    at = digits[-1].start()
    return answer[:at] + str((int(answer[at]) + 1) % 10) + answer[at + 1 :]


# --- extraction -------------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (r"so the answer is \boxed{\frac{1}{2}}.", r"\frac{1}{2}"),
        (r"first \boxed{1}, finally \boxed{2}", "2"),
        (r"\boxed{\frac{\sqrt{3}}{2}}", r"\frac{\sqrt{3}}{2}"),
        (r"the set \boxed{\{1, 2\}}", r"\{1, 2\}"),
        (r"$\boxed 5$", "5"),
        (r"\fbox{x^2+1}", "x^2+1"),
        (r"<think>maybe \boxed{3}</think>The answer is \boxed{4}.", "4"),
        (r"<think>so \boxed{3}</think>The answer is three.", "3"),
        (r"<think>still thinking, \boxed{3}", "3"),
        (r"cut off at \boxed{12", None),
        (r"\boxed{}", None),
        ("no box at all: 42", None),
        (r"\boxedx{3}", None),
    ],
)
def test_extract_boxed(text: str, expected: str | None) -> None:
    assert extract_boxed(text) == expected


# --- grading ----------------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("answer", "ground_truth"),
    [
        (r"\frac{1}{2}", "0.5"),
        (r"2\sqrt{2}", r"\sqrt{8}"),
        (r"\dfrac{3}{4}", r"\frac34"),
        ("[2,5)", "[2, 5)"),
        (r"(-\infty,3]\cup[5,\infty)", r"(-\infty, 3] \cup [5, \infty)"),
        ("x^2+1", "1+x^2"),
        ("12.0", "12"),
        ("1,000", "1000"),
        ("x = 12", "12"),
        ("3, 2", "2, 3"),
        (r"72^\circ", "72"),
        (r"\text{Monday}", "monday"),
        (r"$\frac{1}{2}$", r"\boxed{\frac{1}{2}}"),
        ("2^{2024}", "2^{2024}"),
    ],
)
def test_equivalent_answers(answer: str, ground_truth: str) -> None:
    assert is_equivalent(answer, ground_truth)


@pytest.mark.parametrize(
    ("answer", "ground_truth"),
    [
        ("3", "4"),
        ("[2,5)", "(2,5)"),
        (r"2\sqrt{2}", r"2\sqrt{3}"),
        ("x^2+1", "x^2+2"),
        (r"\pi", "3"),
        (None, "3"),
        ("", "3"),
        ("3", ""),
    ],
)
def test_wrong_answers(answer: str | None, ground_truth: str) -> None:
    assert not is_equivalent(answer, ground_truth)


@pytest.mark.parametrize("answer", ["10^{10^{10}}", "(x+1)^{5000}", "(1000000)!", "1" * 500])
def test_pathological_answers_are_refused_fast(answer: str) -> None:
    assert symbolic_check_refused(answer)
    started = time.monotonic()
    assert not is_equivalent(answer, "3")
    assert time.monotonic() - started < 2.0


def test_grading_in_worker_threads() -> None:
    # signal-based timeouts would raise in these threads; 1/2 == 0.5 needs math-verify itself
    pairs = [(r"\frac{1}{2}", "0.5"), (r"2\sqrt{2}", r"\sqrt{8}"), ("3", "4")] * 4
    with ThreadPoolExecutor(max_workers=6) as pool:
        results = list(pool.map(lambda pair: is_equivalent(*pair), pairs))
    assert results == [True, True, False] * 4


# --- instances --------------------------------------------------------------------------------

def test_plain_pair_gets_default_prompt() -> None:
    normalized = normalize_instance({"problem": "What is 2+2?", "answer": "4"})
    roles = [m["role"] for m in normalized.messages]
    assert roles == ["system", "user"]
    assert normalized.messages[1]["content"].startswith("What is 2+2?")
    assert r"\boxed{}" in normalized.messages[1]["content"]
    assert normalized.ground_truth == "4"
    assert normalized.max_iterations == 1


@pytest.mark.parametrize(
    "instance",
    [
        {"question": "What is 2+2?", "final_answer": "4"},
        {"problem": "What is 2+2?", "answer": 4},
        {"problem": "What is 2+2?", "solution": r"Add them: $2+2=\boxed{4}$."},
        {"prompt": "What is 2+2?", "ground_truth": "4"},
    ],
)
def test_plain_pair_aliases(instance: dict[str, Any]) -> None:
    assert normalize_instance(instance).ground_truth == "4"


def test_verl_row_keeps_prompt_unchanged() -> None:
    row = load_samples("deepscaler_sample")[0]
    normalized = normalize_instance(row)
    assert normalized.messages == row["prompt"]
    assert normalized.ground_truth == row["reward_model"]["ground_truth"]
    assert normalized.metadata["data_source"] == "deepscaler"
    normalized.messages[0]["content"] = "changed"
    assert row["prompt"][0]["content"] != "changed"


@pytest.mark.parametrize(
    ("instance", "message"),
    [
        ({}, SHAPE_HINT),
        ({"problem": "2+2?"}, SHAPE_HINT),
        ({"answer": "4"}, SHAPE_HINT),
        ({"problem": "", "answer": "4"}, "'problem'"),
        ({"problem": "2+2?", "answer": ""}, "'answer'"),
        ({"problem": "2+2?", "solution": "four"}, "'solution'"),
        ({"prompt": [{"role": "user", "content": "2+2?"}]}, "'reward_model.ground_truth'"),
        ({"prompt": [], "reward_model": {"ground_truth": "4"}}, "'prompt'"),
        ({"prompt": [{"role": "robot", "content": "hi"}], "reward_model": {"ground_truth": "4"}},
         "prompt[0]"),
        ({"prompt": [{"role": "user", "content": "x"}], "reward_model": {"ground_truth": ["4"]}},
         "'reward_model.ground_truth'"),
        ({"prompt": [{"role": "user", "content": "x"}],
          "reward_model": {"style": "model", "ground_truth": "4"}}, "'reward_model.style'"),
        ({"problem": "2+2?", "answer": "4", "max_iterations": 0}, "'max_iterations'"),
        ({"problem": "2+2?", "answer": "4", "max_iterations": "3"}, "'max_iterations'"),
        (["not", "an", "object"], "JSON object"),
    ],
)
def test_invalid_instances_name_the_field(instance: Any, message: str) -> None:
    with pytest.raises(ValueError) as raised:
        MathHandler().validate_instance(instance)
    assert message in str(raised.value)


def test_max_iterations_is_capped() -> None:
    instance = {"problem": "2+2?", "answer": "4", "max_iterations": 1000}
    assert normalize_instance(instance).max_iterations == MAX_ITERATIONS_CAP


# --- shipped data -----------------------------------------------------------------------------

MATH_SAMPLES = load_samples("math")
VERL_SAMPLES = load_samples("deepscaler_sample")


def test_shipped_data_sizes_and_shapes() -> None:
    assert len(MATH_SAMPLES) >= 30
    assert all(set(row) == {"problem", "answer"} for row in MATH_SAMPLES)
    assert len(VERL_SAMPLES) >= 5
    assert all(row["reward_model"]["style"] == "rule" for row in VERL_SAMPLES)
    with pytest.raises(ValueError, match="available: deepscaler_sample, math"):
        load_samples("nope")


@pytest.mark.parametrize("row", MATH_SAMPLES + VERL_SAMPLES, ids=lambda row: str(row)[:40])
def test_shipped_answer_grades_correct_and_perturbed_does_not(row: dict[str, Any]) -> None:
    ground_truth = normalize_instance(row).ground_truth
    assert is_equivalent(ground_truth, ground_truth)
    assert not is_equivalent(perturb(ground_truth), ground_truth)


@pytest.mark.parametrize("row", MATH_SAMPLES[:5] + VERL_SAMPLES[:2], ids=lambda row: str(row)[:40])
def test_shipped_rollout_rewards_the_boxed_answer(row: dict[str, Any]) -> None:
    answer = normalize_instance(row).ground_truth
    _, _, result = rollout(row, [f"Working... so the answer is $\\boxed{{{answer}}}$."])
    assert result.reward == 1.0
    _, _, result = rollout(row, [f"The answer is $\\boxed{{{perturb(answer)}}}$."])
    assert result.reward == 0.0 and result.details["correct"] is False


# --- the RUN loop -----------------------------------------------------------------------------

PROBLEM = {"problem": "What is 3 times 4?", "answer": "12"}


def test_single_turn_answer() -> None:
    job, llm, result = rollout(PROBLEM, [r"3 times 4 is \boxed{12}."])
    assert isinstance(llm, ChatLLM)
    assert job.init_result["messages"] == llm.messages[:2]
    assert job.run_result == {"answer": "12", "iterations": 1, "finish_reason": "answer", "tool_calls": 0,
                              "tool_errors": 0, "tool_log": []}
    assert result == EvalResult(1.0, {"answer": "12", "ground_truth": "12", "correct": True})


def test_follow_up_sent_when_no_boxed_answer() -> None:
    instance = {**PROBLEM, "max_iterations": 3}
    job, llm, result = rollout(instance, ["It is twelve.", r"\boxed{12}", "unused"])
    assert job.run_result == {"answer": "12", "iterations": 2, "finish_reason": "answer", "tool_calls": 0,
                              "tool_errors": 0, "tool_log": []}
    assert [m["role"] for m in llm.messages] == ["system", "user", "assistant", "user", "assistant"]
    assert llm.messages[3]["content"] == FOLLOW_UP
    assert llm.replies == ["unused"]
    assert result.reward == 1.0


def test_max_iterations_respected() -> None:
    instance = {**PROBLEM, "max_iterations": 3}
    job, llm, result = rollout(instance, ["twelve", "still twelve", "12!", "never asked"])
    assert job.run_result == {"answer": None, "iterations": 3, "finish_reason": "max_iterations",
                              "tool_calls": 0, "tool_errors": 0, "tool_log": []}
    assert llm.num_turns == 3
    assert [m["content"] for m in llm.messages].count(FOLLOW_UP) == 2
    assert llm.messages[-1]["role"] == "assistant"  # no follow-up without a turn to answer it
    assert result.reward == 0.0 and result.details["answer"] is None


def test_default_is_one_turn_without_follow_up() -> None:
    job, llm, _ = rollout(PROBLEM, ["twelve", "unused"])
    assert job.run_result["iterations"] == 1
    assert FOLLOW_UP not in [m["content"] for m in llm.messages]


def test_stops_when_context_runs_out() -> None:
    # the prompt is ~200 characters; after a 200-character reply fewer than 64 tokens are left
    instance = {**PROBLEM, "max_iterations": 5}
    job, llm, _ = rollout(instance, ["x" * 200, "unused"], context_length=440)
    assert job.run_result["finish_reason"] == "context"
    assert job.run_result["iterations"] == 1
    assert llm.messages[-1]["role"] == "assistant"


def test_stops_when_time_budget_is_spent() -> None:
    handler = MathHandler()
    job = JobContext(job_id="j", task="math", instance=PROBLEM, deadline=time.monotonic() - 1)
    job.init_result = run(handler.init(job))
    result = run(handler.run(job, ScriptedLLM(["unused"])))
    assert result == {"answer": None, "iterations": 0, "finish_reason": "time", "tool_calls": 0,
                      "tool_errors": 0, "tool_log": []}


def test_run_without_init_result_normalises_the_instance() -> None:
    job = JobContext(job_id="j", task="math", instance=PROBLEM)
    result = run(MathHandler().run(job, ScriptedLLM([r"\boxed{12}"])))
    assert result["answer"] == "12"
    job.run_result = result
    assert run(MathHandler().eval(job)).reward == 1.0


def test_the_instance_is_parsed_once_per_job_context_and_run_never_redoes_init() -> None:
    parsed: list[Any] = []

    class Counting(MathHandler):
        def parse_instance(self, instance: dict[str, Any]) -> Any:
            parsed.append(instance)
            return super().parse_instance(instance)

        async def init(self, job: JobContext) -> dict[str, Any]:
            raise AssertionError("RUN and EVAL read the parsed instance, not INIT's work")

    handler = Counting()
    job = JobContext(job_id="j", task="math", instance=PROBLEM)
    job.run_result = run(handler.run(job, ScriptedLLM([r"\boxed{12}"])))
    assert run(handler.eval(job)).reward == 1.0
    assert parsed == [PROBLEM] and job.parsed_instance.ground_truth == "12"
    handler.validate_instance(PROBLEM)  # the gateway's check parses too, with nothing to keep
    assert len(parsed) == 2


def test_eval_from_a_non_main_thread() -> None:
    job = JobContext(job_id="j", task="math", instance={"problem": "Half?", "answer": "0.5"})
    job.init_result = run(MathHandler().init(job))
    job.run_result = {"answer": r"\frac{1}{2}", "iterations": 1, "finish_reason": "answer"}
    results: list[EvalResult] = []
    worker = threading.Thread(target=lambda: results.append(run(MathHandler().eval(job))))
    worker.start()
    worker.join(timeout=60)
    assert results and results[0].reward == 1.0


def test_exception_fallbacks_are_structured() -> None:
    handler = MathHandler()
    job = JobContext(job_id="j", task="math", instance=PROBLEM, init_result={"ground_truth": "12"})
    fallback = run(handler.run_exception(job, RuntimeError("backend gone")))
    assert fallback["answer"] is None and fallback["finish_reason"] == "error"
    assert "RuntimeError: backend gone" in fallback["error"]
    job.run_result = fallback
    assert run(handler.eval(job)).reward == 0.0
    failed = run(handler.eval_exception(job, ValueError("bad")))
    assert failed.reward == 0.0 and failed.details["correct"] is False
    assert failed.details["ground_truth"] == "12"


# --- noop -------------------------------------------------------------------------------------

class UntouchableLLM:
    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"noop touched llm.{name}")


@pytest.mark.parametrize("instance", [{}, {"anything": [1, 2]}, {"problem": "x"}])
def test_noop_handler_does_nothing(instance: dict[str, Any]) -> None:
    handler = NoopHandler()
    handler.validate_instance(instance)
    job = JobContext(job_id="j", task="noop", instance=instance)
    assert run(handler.init(job)) == {}
    assert run(handler.run(job, UntouchableLLM())) == {}  # type: ignore[arg-type]
    assert run(handler.eval(job)).reward == 0.0
