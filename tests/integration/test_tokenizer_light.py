"""The light tokenizer (``tokenizers`` + jinja2) is exactly transformers' on the project's tokenizers:
the same chat-template rendering, the same ids, the same decoded text, over many conversations
(tools, tool calls and tool messages, ``<think>`` and reasoning fields, unicode, special-token
text inside content). A worker and the gateway never import transformers or torch."""
from __future__ import annotations

import json
import random
import subprocess
import sys

import pytest

from prorl_celery.llm.tokenizer import HFTokenizer, load_tokenizer

transformers = pytest.importorskip("transformers")

PIECES = ["Hello", "What is 2 + 3?", "  leading and trailing spaces  ", "line one\nline two\n\n", "tabs\tand\r\n",
          "héllo wörld", "日本語のテキスト", "中文，标点。", "emoji 🙂🚀👩‍👩‍👧", "Ελληνικά", "עברית ומספרים 123",
          "zero\u200bwidth", "combining e\u0301", "<think>\nreasoning here\n</think>\n\nThe answer", "\\boxed{42}",
          "<|im_end|> inside text", "<|eot_id|> and <|begin_of_text|>", "<tool_call>\n{\"name\": \"x\"}\n</tool_call>",
          "```python\nprint('hi')\n```", "{\"json\": [1, 2, {\"a\": null}]}", "", " ", "\n", "a" * 300,
          "mixed 日本 and emoji 🎉 and \u00a0nbsp", "'quotes' \"double\" `back`", "n't 's 're ,.!?"]
TOOLS = [
    {"type": "function", "function": {"name": "python", "description": "Run Python code.",
                                      "parameters": {"type": "object", "properties": {"code": {"type": "string"}},
                                                     "required": ["code"]}}},
    {"type": "function", "function": {"name": "search", "description": "Søg i korpus 🔍",
                                      "parameters": {"type": "object", "properties": {
                                          "query": {"type": "string"}, "k": {"type": "integer", "default": 3}}}}},
]


def _text(rng: random.Random) -> str:
    return "".join(rng.choice(PIECES) for _ in range(rng.randint(1, 3)))


def _tool_call(rng: random.Random, index: int) -> dict:
    arguments: object = {"code": _text(rng)} if rng.random() < 0.5 else {"query": _text(rng), "k": rng.randint(1, 9)}
    if rng.random() < 0.3:
        arguments = json.dumps(arguments, ensure_ascii=False)
    return {"id": f"call_{index}", "type": "function",
            "function": {"name": rng.choice(["python", "search"]), "arguments": arguments}}


def conversations(count: int, seed: int, single_tool_call: bool) -> list[tuple[list[dict], list[dict] | None]]:
    """Random conversations: system or not, user/assistant turns, assistant tool calls followed by
    tool messages, <think> in content or reasoning_content, keys set to None."""
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        messages: list[dict] = []
        if rng.random() < 0.4:
            messages.append({"role": "system", "content": _text(rng)})
        for turn in range(rng.randint(1, 4)):
            messages.append({"role": "user", "content": _text(rng)})
            if rng.random() < 0.2 and turn:
                break  # ends on a user turn
            assistant: dict = {"role": "assistant", "content": _text(rng)}
            if rng.random() < 0.3:
                assistant["content"] = f"<think>\n{_text(rng)}\n</think>\n\n{assistant['content']}"
            if rng.random() < 0.2:
                assistant["reasoning_content"] = _text(rng)
            if rng.random() < 0.2:
                assistant["tool_calls"] = None  # dropped, as transformers drops None values
            calls = []
            if rng.random() < 0.4:
                calls = [_tool_call(rng, i) for i in range(1 if single_tool_call else rng.randint(1, 3))]
                assistant["tool_calls"] = calls
                if rng.random() < 0.3:
                    assistant["content"] = ""
            messages.append(assistant)
            for call in calls:
                tool = {"role": "tool", "content": _text(rng), "tool_call_id": call["id"]}
                if rng.random() < 0.3:
                    tool["name"] = call["function"]["name"]
                messages.append(tool)
            if calls and rng.random() < 0.5:
                messages.append({"role": "assistant", "content": _text(rng)})
        tools = rng.choice([None, TOOLS, TOOLS[:1]])
        out.append((messages, tools))
    return out


def _render(render, messages, tools, add_generation_prompt):
    try:
        return render(messages, tools=tools, tokenize=False, add_generation_prompt=add_generation_prompt)
    except Exception as error:  # noqa: BLE001 - both must refuse alike
        return f"<error {type(error).__name__}: {error}>"


@pytest.mark.parametrize("name", ["qwen3", "llama3"])
def test_same_as_transformers(name: str, qwen3_tokenizer: str, llama3_tokenizer: str) -> None:
    path = qwen3_tokenizer if name == "qwen3" else llama3_tokenizer
    ours = HFTokenizer(path)
    theirs = transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)
    assert ours.special_tokens_map == theirs.special_tokens_map
    assert ((ours.eos_token, ours.bos_token, ours.eos_token_id)
            == (theirs.eos_token, theirs.bos_token, theirs.eos_token_id))
    assert len(ours) == len(theirs)
    rendered = 0
    for messages, tools in conversations(150, seed=17, single_tool_call=name == "llama3"):
        for add_generation_prompt in (False, True):
            text = _render(ours.apply_chat_template, messages, tools, add_generation_prompt)
            expected = _render(theirs.apply_chat_template, messages, tools, add_generation_prompt)
            assert text == expected, (messages, tools, add_generation_prompt)
            if text.startswith("<error"):
                continue
            rendered += 1
            ids = ours.encode(text, add_special_tokens=False)
            assert ids == theirs.encode(text, add_special_tokens=False)
            for skip in (False, True):
                assert ours.decode(ids, skip_special_tokens=skip) == theirs.decode(ids, skip_special_tokens=skip)
    assert rendered > 200
    rng = random.Random(5)
    special = sorted(theirs.added_tokens_decoder)
    for _ in range(300):
        text = _text(rng)
        for special_tokens in (False, True):
            assert ours.encode(text, add_special_tokens=special_tokens) == theirs.encode(
                text, add_special_tokens=special_tokens), text
        ids = [rng.randrange(len(theirs)) if rng.random() < 0.7 else rng.choice(special) for _ in range(20)]
        for skip in (False, True):
            assert ours.decode(ids, skip_special_tokens=skip) == theirs.decode(ids, skip_special_tokens=skip), ids


def test_chat_tokenizer_keeps_its_interface(qwen3_tokenizer: str) -> None:
    tok = load_tokenizer(qwen3_tokenizer)
    assert tok.eot_token == "<|im_end|>" and tok.eot_id == tok.hf.convert_tokens_to_ids("<|im_end|>")
    ids = tok.prompt_ids([{"role": "user", "content": "hi"}])
    assert tok.decode(ids, skip_special_tokens=False).endswith("<|im_start|>assistant\n")
    assert tok.hf.encode("hi") == tok.hf.encode("hi", add_special_tokens=True)
    assert tok.hf.decode(tok.hf.encode("héllo 🙂")) == "héllo 🙂"


def test_service_processes_do_not_import_transformers(qwen3_tokenizer: str) -> None:
    """A worker (tasks, pipeline, the tokenizer loaded and used) and the gateway app."""
    code = (
        "import sys\n"
        "import prorl_celery.worker.tasks\n"
        "from prorl_celery.llm.tokenizer import load_tokenizer\n"
        f"tok = load_tokenizer({qwen3_tokenizer!r})\n"
        "tok.prompt_ids([{'role': 'user', 'content': 'hi'}])\n"
        "import api\n"
        "api.create_app()\n"
        "heavy = sorted(m for m in ('transformers', 'torch') if m in sys.modules)\n"
        "print(','.join(heavy))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "", f"imported: {out.stdout.strip()}"
