"""A scripted LLM server for a test of your own: rules in, replies out, every request in ``/_log``.

Run it: ``python examples/testing/scripted_server.py`` (``tests/integration/test_testing_guide.py``
does). ``prorl llm-serve --scripted RULES.json`` serves the same rules as a process of its own.
"""
import httpx

from prorl_celery.dev.devmodels import ensure_tokenizer
from prorl_celery.dev.llm_server import BackgroundServer, ScriptedEngine, create_llm_app
from prorl_celery.llm.tokenizer import load_tokenizer

TASK = "MYAGENT-TASK: what is 2 + 3?"
RULES = [
    # whole prompt searched: the rule still matches on turn 2, whose last message is the tool's
    {"match": r"MYAGENT-TASK", "scope": "prompt",
     "replies": ["I will ask the calculator.", "The answer is \\boxed{5}."]},
    # only for requests whose seed s has s % 2 == 0; the next rule answers the others, 0.2 s late
    {"match": r"^Fork: 2 \+ 3", "seed_mod": [2, 0], "replies": ["5"]},
    {"match": r"^Fork: 2 \+ 3", "replies": ["6"], "delay_s": 0.2},
]

tokenizer = ensure_tokenizer("qwen3")
chat = load_tokenizer(str(tokenizer))
engine = ScriptedEngine(str(tokenizer), RULES)
with BackgroundServer(create_llm_app(engine)) as server, httpx.Client(base_url=server.url) as http:
    def reply(messages: list[dict], **body) -> str:
        answer = http.post("/v1/completions", json={"prompt": chat.prompt_ids(messages), "max_tokens": 64, **body})
        return answer.raise_for_status().json()["choices"][0]["text"]

    turn_1 = [{"role": "user", "content": TASK}]
    assert reply(turn_1) == "I will ask the calculator."
    turn_2 = [*turn_1, {"role": "assistant", "content": "I will ask the calculator."},
              {"role": "user", "content": "calculator: 5"}]
    assert reply(turn_2) == "The answer is \\boxed{5}."  # replies[1]: one assistant turn before it
    fork = [{"role": "user", "content": "Fork: 2 + 3?"}]
    assert (reply(fork, seed=4), reply(fork, seed=7)) == ("5", "6")
    assert reply([{"role": "user", "content": "no rule matches"}], max_tokens=8) != ""  # random ids

    log = http.get("/_log").json()  # every request, in the order they came
    assert [entry["prompt_ids"] for entry in log[:2]] == [chat.prompt_ids(turn_1), chat.prompt_ids(turn_2)]
    assert log[0]["output_ids"] == chat.encode("I will ask the calculator.") + [engine.eos_token_id]
    assert len(log[0]["logprobs"]) == len(log[0]["output_ids"]) and log[0]["finish_reason"] == "stop"
    # the delayed rule's request took its 0.2 s (asyncio may wake a timer up to its clock's resolution early)
    assert log[3]["finished"] - log[3]["started"] >= 0.19
    assert log[4]["max_tokens"] == 8
    assert sorted(log[0]["request_keys"]) == ["max_tokens", "prompt"] and not log[0]["aborted"]
    assert http.post("/_reset").json() == {"cleared": 5} and http.get("/_log").json() == []
print("scripted server: every rule answered as scripted")
