"""Token-in/token-out through the whole service (the gateway app in this process, real workers),
on the real Qwen3 and Llama 3.1 templates.

The scripted backends answer with pseudo-random token ids (special and added tokens included),
the worst case for a text pipeline. Every returned trajectory must equal, id for id, what its
backend received and produced; the text re-tokenization path is measured beside it.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from prorl_celery.llm.fidelity import check_trajectory
from prorl_celery.llm.tokenizer import load_tokenizer

JOBS_PER_TEMPLATE = 100


@pytest.fixture
def gateway(app_gateway):
    """This module's gateway is the app in this process (Flask's test client)."""
    return app_gateway


@pytest.fixture(params=["qwen3", "llama3"])
def random_backend(request, gateway, random_llm_servers):
    tokenizer = request.getfixturevalue(f"{request.param}_tokenizer")
    server = random_llm_servers[request.param]
    server.reset()  # its log is this test's backend calls only
    assert gateway.post("/add_llm_server", json={"address": server.address()}).status_code == 200
    return request.param, tokenizer, server


def test_trajectories_are_exactly_what_the_backend_saw(gateway, random_backend):
    name, tokenizer, server = random_backend

    def rollout(i: int) -> dict:
        instance = {"data_source": "math", "problem": f"Problem {i}: what is {i} + {i}?", "answer": str(2 * i),
                    "max_iterations": 3}
        return gateway.process(instance, sampling_params={"tokenizer": tokenizer, "max_tokens": 24,
                                                          "temperature": 1.0})

    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(rollout, range(JOBS_PER_TEMPLATE)))
    assert all(r["status"] == "completed" for r in results), [r["error"] for r in results if r["error"]][:3]

    served = {tuple(call["prompt_ids"]): call for call in server.log()}
    chat = load_tokenizer(tokenizer)
    turns = multi_turn = text_drift = 0
    for result in results:
        trajectory = result["trajectory"]
        ids = trajectory["prompt_ids"] + trajectory["response_ids"]
        for turn in trajectory["turns"]:
            call = served[tuple(ids[:turn["context_len"]])]  # the backend received exactly this context
            start = len(trajectory["prompt_ids"]) + turn["output_start"]
            assert call["output_ids"] == ids[start:start + turn["output_len"]]
            assert call["logprobs"] == trajectory["response_logprobs"][turn["output_start"]:
                                                                       turn["output_start"] + turn["output_len"]]
            turns += 1
        multi_turn += trajectory["num_turns"] > 1
        text_drift += not check_trajectory(chat, trajectory).match
    assert turns == len(served)  # no backend call is missing from the trajectories
    assert multi_turn >= JOBS_PER_TEMPLATE * 0.9
    print(f"\n{name}: {len(results)} trajectories, {turns} turns, token-in/token-out drift 0; "
          f"text re-tokenization drifts in {text_drift}/{len(results)}")
    assert text_drift > 0  # random ids do not survive decode/re-encode: the check has teeth


@pytest.mark.parametrize("template", ["qwen3", "llama3"])
def test_text_replies_round_trip_through_the_template(request, template):
    """With canonical text replies, suffix-only tokenization equals rendering the whole chat,
    up to what the template itself rewrites: Qwen3 renders the last assistant turn with an empty
    ``<think>`` block the model never produced, so the text path drifts exactly there."""
    from prorl_celery.llm.backends import Completion
    from prorl_celery.llm.session import TokenSession
    chat = load_tokenizer(request.getfixturevalue(f"{template}_tokenizer"))

    class Echo:  # a backend double behind the real LLMBackend interface
        address = "echo"

        def __init__(self) -> None:
            self.replies = iter(["Let me see.", "It is \\boxed{4}.", "Done."])

        async def complete(self, prompt_ids, params):
            ids = chat.encode(next(self.replies)) + [chat.eot_id]
            return Completion(ids, [-0.5] * len(ids), "stop")

    import asyncio
    session = TokenSession(tokenizer=chat, backend=Echo(), sampling_params={}, max_model_len=4096,
                           default_max_tokens=64)

    async def converse() -> None:
        session.start([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}])
        await session.generate()
        session.add_message("user", "Box it.")
        await session.generate()
        session.add_message("user", "Thanks!")
        await session.generate()
    asyncio.run(converse())
    trajectory = session.trajectory()
    report = check_trajectory(chat, trajectory)
    if template == "llama3":
        assert report.match, report.describe(chat)
    else:  # every observation suffix matched; only the template's own rewrite differs
        last_turn = len(trajectory["prompt_ids"]) + trajectory["turns"][-1]["output_start"]
        assert report.first_divergence == last_turn, report.describe(chat)
        assert chat.decode(report.got, skip_special_tokens=False).startswith("<think>\n\n</think>")
