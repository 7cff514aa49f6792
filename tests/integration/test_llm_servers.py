"""The HTTP LLM server over real sockets: three protocols, scripted and torch engines, aborts."""
from __future__ import annotations

import asyncio
import contextlib
import json
import time

import httpx
import pytest

from prorl_celery.dev.llm_server import SamplingParams, ScriptedEngine

pytest_plugins = ["tests.conftest_llm"]  # also registered by tests/conftest.py

LONG = " ".join(f"w{i}" for i in range(120))
RULES = [
    {"match": r"What is 2\+2",
     "replies": ["<think>Two and two.</think>The answer is 4.", "Still 4.", "Final: 4."]},
    {"match": r"^tool says (\w+)$", "replies": ["I read the tool output."]},
    {"match": "TASK-7", "replies": ["first", "second", "third"], "scope": "prompt"},
    {"match": "LONG", "replies": [LONG]},
    {"match": "WAIT", "replies": ["late"], "delay_s": 30},
]
QWEN_EOS, LLAMA_EOT = 151645, 128009


def chat_ids(tok, messages):
    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return tok.encode(text, add_special_tokens=False)


def reply_ids(tok, reply, eos):
    return tok.encode(reply, add_special_tokens=False) + [eos]


def post(server, path, body):
    return httpx.post(server.url + path, json=body, timeout=30)


@pytest.fixture
def qwen(scripted_llm_server):
    return scripted_llm_server(RULES, "qwen3")


@pytest.fixture
def question(qwen3_hf_tokenizer):
    return chat_ids(qwen3_hf_tokenizer, [{"role": "user", "content": "What is 2+2?"}])


# ----------------------------------------------------------------------------- vLLM


def test_vllm_scripted_reply(qwen, question, qwen3_hf_tokenizer):
    tok = qwen3_hf_tokenizer
    body = post(qwen, "/v1/completions", {"model": "x", "prompt": question, "max_tokens": 64,
                                          "logprobs": 0, "return_token_ids": True}).json()
    assert body["object"] == "text_completion" and body["id"].startswith("cmpl-")
    choice = body["choices"][0]
    expected = reply_ids(tok, RULES[0]["replies"][0], QWEN_EOS)
    assert choice["token_ids"] == expected and choice["prompt_token_ids"] == question
    assert (choice["finish_reason"], choice["stop_reason"]) == ("stop", None)
    assert choice["text"] == tok.decode(expected[:-1], skip_special_tokens=True)
    assert choice["text"] == "<think>Two and two.</think>The answer is 4."
    logprobs = choice["logprobs"]
    assert len(logprobs["token_logprobs"]) == len(logprobs["tokens"]) == len(expected)
    assert len(logprobs["top_logprobs"]) == len(logprobs["text_offset"]) == len(expected)
    assert all(lp < 0 for lp in logprobs["token_logprobs"])
    assert logprobs["tokens"][-1] == "<|im_end|>"
    assert logprobs["top_logprobs"][0] == {"<think>": logprobs["token_logprobs"][0]}
    assert body["usage"] == {"prompt_tokens": len(question), "completion_tokens": len(expected),
                             "total_tokens": len(question) + len(expected),
                             "prompt_tokens_details": None}


def test_vllm_length_stop_ids_and_defaults(qwen, question, qwen3_hf_tokenizer):
    tok = qwen3_hf_tokenizer
    expected = reply_ids(tok, RULES[0]["replies"][0], QWEN_EOS)
    cut = post(qwen, "/v1/completions", {"prompt": question, "max_tokens": 3,
                                         "return_token_ids": True}).json()["choices"][0]
    assert cut["token_ids"] == expected[:3] and cut["finish_reason"] == "length"
    assert cut["text"] == tok.decode(expected[:3], skip_special_tokens=True)
    assert cut["logprobs"] is None
    stopped = post(qwen, "/v1/completions",
                   {"prompt": question, "max_tokens": 64, "return_token_ids": True,
                    "stop_token_ids": [expected[4]]}).json()["choices"][0]
    assert stopped["token_ids"] == expected[:5]
    assert (stopped["finish_reason"], stopped["stop_reason"]) == ("stop", expected[4])
    assert stopped["text"] == tok.decode(expected[:4], skip_special_tokens=True)
    long_prompt = chat_ids(tok, [{"role": "user", "content": "LONG"}])
    default = post(qwen, "/v1/completions", {"prompt": long_prompt}).json()["choices"][0]
    assert default["finish_reason"] == "length" and default["token_ids"] is None
    assert default["text"] == tok.decode(reply_ids(tok, LONG, QWEN_EOS)[:16])  # vLLM's default 16
    as_text = post(qwen, "/v1/completions", {"prompt": tok.decode(question), "max_tokens": 64,
                                             "return_token_ids": True}).json()["choices"][0]
    assert as_text["prompt_token_ids"] == question and as_text["token_ids"] == expected


@pytest.mark.parametrize("path, body, fragment", [
    ("/v1/completions", {"prompt": [1, 2], "n": 2}, "n must be 1"),
    ("/v1/completions", {"prompt": [1, 2], "max_new_tokens": 5}, "'max_tokens'"),
    ("/v1/completions", {"prompt": [1, 2], "stream": True}, "stream"),
    ("/v1/completions", {"prompt": [1, 999_999]}, "Token id 999999 is out of vocabulary"),
    ("/v1/completions", {"prompt": []}, "empty"),
    ("/v1/completions", {"prompt": [1, 2], "max_tokens": 10**6}, "maximum context length"),
    ("/v1/completions", {"prompt": [1, 2], "stop": ["\n"]}, "stop strings"),
    ("/generate", {"input_ids": [1, 2], "sampling_params": {"seed": 1}}, "'sampling_seed'"),
    ("/generate", {"sampling_params": {}}, "exactly one of input_ids and text"),
    ("/completion", {"prompt": [1, 2], "max_tokens": 5}, "'n_predict'"),
    ("/completion", {"prompt": [1, 2], "stop_token_ids": [5]}, "not in this protocol"),
])
def test_bad_requests_are_400(qwen, path, body, fragment):
    response = post(qwen, path, body)
    assert response.status_code == 400
    assert fragment in response.json()["error"]["message"]


# ----------------------------------------------------------------------------- SGLang, llama.cpp


def test_sglang_generate(qwen, question, qwen3_hf_tokenizer):
    tok = qwen3_hf_tokenizer
    expected = reply_ids(tok, RULES[0]["replies"][0], QWEN_EOS)
    sampling = {"max_new_tokens": 64, "temperature": 0}
    body = post(qwen, "/generate", {"input_ids": question, "return_logprob": True,
                                    "sampling_params": sampling}).json()
    assert body["output_ids"] == expected
    assert body["text"] == tok.decode(expected[:-1], skip_special_tokens=True)
    meta = body["meta_info"]
    assert meta["finish_reason"] == {"type": "stop", "matched": QWEN_EOS}
    assert (meta["prompt_tokens"], meta["completion_tokens"]) == (len(question), len(expected))
    assert [item[1] for item in meta["output_token_logprobs"]] == expected
    assert all(item[0] < 0 and item[2] is None for item in meta["output_token_logprobs"])
    short = post(qwen, "/generate", {"input_ids": question, "return_logprob": True,
                                     "top_logprobs_num": 2, "return_text_in_logprobs": True,
                                     "sampling_params": {"max_new_tokens": 2}}).json()
    assert short["output_ids"] == expected[:2]
    assert short["meta_info"]["finish_reason"] == {"type": "length", "length": 2}
    assert short["meta_info"]["output_token_logprobs"][0][2] == "<think>"
    assert [len(top) for top in short["meta_info"]["output_top_logprobs"]] == [2, 2]
    plain = post(qwen, "/generate", {"input_ids": question}).json()
    assert "output_token_logprobs" not in plain["meta_info"] and plain["output_ids"] == expected


def test_llamacpp_completion(qwen, question, qwen3_hf_tokenizer):
    tok = qwen3_hf_tokenizer
    expected = reply_ids(tok, RULES[0]["replies"][0], QWEN_EOS)
    body = post(qwen, "/completion", {"prompt": question, "n_predict": 64, "n_probs": 1,
                                      "return_tokens": True, "cache_prompt": True}).json()
    assert body["tokens"] == expected and body["stop"] is True and body["stop_type"] == "eos"
    assert body["content"] == "<think>Two and two.</think>The answer is 4."
    assert (body["tokens_predicted"], body["tokens_evaluated"]) == (len(expected), len(question))
    probs = body["completion_probabilities"]
    assert [p["id"] for p in probs] == expected
    assert probs[1]["token"] == "Two" and bytes(probs[1]["bytes"]) == b"Two"
    assert probs[-1]["bytes"] == [] and all(len(p["top_logprobs"]) == 1 for p in probs)
    limited = post(qwen, "/completion", {"prompt": question, "n_predict": 4}).json()
    assert limited["stop_type"] == "limit" and limited["tokens"] == []
    assert limited["tokens_predicted"] == 4 and "completion_probabilities" not in limited


def test_llama3_scripted_reply(scripted_llm_server, llama3_hf_tokenizer):
    tok = llama3_hf_tokenizer
    server = scripted_llm_server(RULES, "llama3")
    prompt = chat_ids(tok, [{"role": "user", "content": "What is 2+2?"}])
    assert prompt[0] == 128000 and prompt.count(128000) == 1
    choice = post(server, "/v1/completions", {"prompt": prompt, "max_tokens": 64,
                                              "return_token_ids": True}).json()["choices"][0]
    assert choice["token_ids"] == reply_ids(tok, RULES[0]["replies"][0], LLAMA_EOT)
    assert choice["text"] == "<think>Two and two.</think>The answer is 4."


# ----------------------------------------------------------------------------- scripting


def _turn(server, prompt):
    choice = post(server, "/v1/completions", {"prompt": prompt, "max_tokens": 64,
                                              "return_token_ids": True}).json()["choices"][0]
    return choice["text"], choice["token_ids"]


def test_turns_are_counted_token_in_token_out(qwen, question, qwen3_hf_tokenizer):
    tok = qwen3_hf_tokenizer
    prompt, texts = list(question), []
    for observation in ["What is 2+2 again?", "What is 2+2, really?", "What is 2+2 now?"]:
        text, ids = _turn(qwen, prompt)
        texts.append(text)
        turn = f"\n<|im_start|>user\n{observation}<|im_end|>\n<|im_start|>assistant\n"
        prompt += ids + tok.encode(turn)
    texts.append(_turn(qwen, prompt)[0])
    assert texts[1:] == ["Still 4.", "Final: 4.", "Final: 4."]  # the last reply repeats


def test_rules_match_the_last_observation(qwen, qwen3_hf_tokenizer, llama3_hf_tokenizer):
    for tok in (qwen3_hf_tokenizer, llama3_hf_tokenizer):
        engine = ScriptedEngine(tok, RULES)
        history = [{"role": "user", "content": "What is 2+2?"},
                   {"role": "assistant", "content": "Let me check."}]
        with_tool = chat_ids(tok, history + [{"role": "tool", "content": "tool says hello"}])
        rule, turn = engine.pick(with_tool)
        assert (rule.replies, turn) == (RULES[1]["replies"], 1)
        with_user = chat_ids(tok, history + [{"role": "user", "content": "unrelated"}])
        assert engine.pick(with_user) == (None, 1)
        task = [{"role": "user", "content": "TASK-7: go"}, {"role": "assistant", "content": "a"},
                {"role": "user", "content": "obs"}, {"role": "assistant", "content": "b"},
                {"role": "user", "content": "obs"}]
        rule, turn = engine.pick(chat_ids(tok, task))
        assert rule.match == "TASK-7" and rule.replies[min(turn, 2)] == "third"
    assert _turn(qwen, chat_ids(qwen3_hf_tokenizer, task))[0] == "third"


def test_random_mode_is_seeded_and_ends_with_eos(qwen, qwen3_hf_tokenizer):
    tok = qwen3_hf_tokenizer
    special = set(tok.added_tokens_decoder)
    seen_special = False
    for i in range(6):
        prompt = chat_ids(tok, [{"role": "user", "content": f"unscripted {i}"}])
        request = {"prompt": prompt, "max_tokens": 48, "return_token_ids": True, "logprobs": 0}
        first = post(qwen, "/v1/completions", request).json()["choices"][0]
        again = post(qwen, "/v1/completions", request).json()["choices"][0]
        other = post(qwen, "/v1/completions", {**request, "seed": 7}).json()["choices"][0]
        ids = first["token_ids"]
        assert ids == again["token_ids"] and ids != other["token_ids"]
        assert ids[-1] == QWEN_EOS and QWEN_EOS not in ids[:-1] and len(ids) <= 48
        assert first["finish_reason"] == "stop"
        assert first["text"] == tok.decode(ids[:-1], skip_special_tokens=True)
        assert len(first["logprobs"]["token_logprobs"]) == len(ids)
        seen_special |= bool(special & set(ids[:-1]))
    assert seen_special


# ----------------------------------------------------------------------------- abort, log


async def _cancelled_request(url, body, after_s):
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        task = asyncio.ensure_future(client.post("/v1/completions", json=body))
        await asyncio.sleep(after_s)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def _wait_for_log(server, predicate, timeout_s=5.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        log = httpx.get(server.url + "/_log").json()
        if log and predicate(log[-1]):
            return log[-1]
        time.sleep(0.05)
    raise AssertionError(f"log never matched: {log}")


@pytest.mark.parametrize("content, min_out", [("LONG", 1), ("WAIT", 0)])
def test_client_disconnect_aborts_generation(scripted_llm_server, qwen3_hf_tokenizer, content,
                                             min_out):
    server = scripted_llm_server(RULES, "qwen3", token_delay_s=0.02)
    prompt = chat_ids(qwen3_hf_tokenizer, [{"role": "user", "content": content}])
    asyncio.run(_cancelled_request(server.url, {"prompt": prompt, "max_tokens": 500}, 0.3))
    record = _wait_for_log(server, lambda r: r["finished"] is not None)
    assert record["aborted"] is True and record["finish_reason"] == "abort"
    assert record["prompt_ids"] == prompt and record["protocol"] == "vllm"
    assert min_out <= len(record["output_ids"]) < 100
    assert len(record["logprobs"]) == len(record["output_ids"])
    time.sleep(0.2)  # generation really stopped: nothing more is appended
    assert httpx.get(server.url + "/_log").json()[-1]["output_ids"] == record["output_ids"]
    after = post(server, "/v1/completions", {"prompt": prompt[:3], "max_tokens": 2})
    assert after.status_code == 200


def test_models_health_log_and_reset(qwen, question):
    assert httpx.get(qwen.url + "/health").json() == {"status": "ok"}
    models = httpx.get(qwen.url + "/v1/models").json()
    assert models["object"] == "list" and models["data"][0]["max_model_len"] == 32768
    post(qwen, "/generate", {"input_ids": question})
    (record,) = httpx.get(qwen.url + "/_log").json()
    assert record["protocol"] == "sglang" and record["aborted"] is False
    assert record["started"] <= record["finished"] and record["output_ids"]
    assert set(record) >= {"request_id", "prompt_ids", "output_ids", "logprobs", "aborted",
                           "started", "finished"}
    assert httpx.post(qwen.url + "/_reset").json() == {"cleared": 1}
    assert httpx.get(qwen.url + "/_log").json() == []


def test_rules_load_from_json(tmp_path, qwen3_hf_tokenizer, question):
    path = tmp_path / "rules.json"
    path.write_text(json.dumps({"rules": RULES[:1]}))
    engine = ScriptedEngine(qwen3_hf_tokenizer, path)
    assert engine.pick(question)[0].replies == RULES[0]["replies"]
    with pytest.raises(ValueError):
        ScriptedEngine(qwen3_hf_tokenizer, [{"match": "x", "replies": []}])


# ----------------------------------------------------------------------------- torch


@pytest.fixture(scope="module")
def torch_engine(tiny_model_dir):
    from prorl_celery.dev.llm_server import TorchEngine

    return TorchEngine(tiny_model_dir)


def _complete(server, prompt, **params):
    body = {"prompt": prompt, "return_token_ids": True, "logprobs": 0, "max_tokens": 8, **params}
    return post(server, "/v1/completions", body).json()["choices"][0]


def test_torch_engine_greedy_and_seeded(llm_server, torch_engine, question):
    import torch

    server = llm_server(torch_engine)
    greedy = _complete(server, question, temperature=0)
    assert greedy == _complete(server, question, temperature=0)
    assert len(greedy["token_ids"]) == 8 and greedy["finish_reason"] == "length"
    with torch.no_grad():  # the reported logprob is the raw log-softmax of the model's logits
        logits = torch_engine.model(input_ids=torch.tensor([question])).logits[0, -1]
    raw = torch.log_softmax(logits.float(), dim=-1)
    assert greedy["token_ids"][0] == int(torch.argmax(raw))
    assert greedy["logprobs"]["token_logprobs"][0] == pytest.approx(float(raw.max()), abs=1e-4)
    def sample(seed):
        return _complete(server, question, temperature=1.0, top_p=0.9, seed=seed)["token_ids"]

    assert sample(11) == sample(11) != sample(12)
    top = post(server, "/completion", {"prompt": question, "n_predict": 3, "n_probs": 4,
                                       "temperature": 0}).json()["completion_probabilities"]
    assert [p["id"] for p in top] == greedy["token_ids"][:3]
    assert all(p["top_logprobs"][0]["id"] == p["id"] and len(p["top_logprobs"]) == 4 for p in top)


def test_torch_engine_stops_on_eos(llm_server, torch_engine, tiny_model_dir, question, tmp_path):
    from transformers import AutoTokenizer

    from prorl_celery.dev.llm_server import TorchEngine

    greedy = _complete(llm_server(torch_engine), question, temperature=0)["token_ids"]
    stopper = greedy[2]
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    tok.eos_token = tok.convert_ids_to_tokens(stopper)  # the tokenizer's eos: stop_reason None
    engine = TorchEngine(tiny_model_dir, tokenizer=tok)
    stopped = _complete(llm_server(engine), question, temperature=0)
    assert stopped["token_ids"] == greedy[:greedy.index(stopper) + 1]
    assert (stopped["finish_reason"], stopped["stop_reason"]) == ("stop", None)
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        (tmp_path / name).symlink_to(tiny_model_dir / name)
    generation = {"eos_token_id": [QWEN_EOS, stopper]}
    (tmp_path / "generation_config.json").write_text(json.dumps(generation))
    by_config = _complete(llm_server(TorchEngine(tmp_path)), question, temperature=0)
    assert by_config["token_ids"] == stopped["token_ids"]
    assert (by_config["finish_reason"], by_config["stop_reason"]) == ("stop", stopper)  # as vLLM


def test_torch_engine_params_validate(torch_engine):
    assert torch_engine.vocab_size % 128 == 0 and torch_engine.max_model_len == 4096
    assert SamplingParams(max_tokens=1).temperature == 1.0
