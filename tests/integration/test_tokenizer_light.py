"""The light tokenizer (``tokenizers`` + jinja2) is exactly transformers' on the project's tokenizers:
the same chat-template rendering, the same ids, the same decoded text, over many conversations
(tools, tool calls and tool messages, ``<think>`` and reasoning fields, unicode, special-token
text inside content). A worker and the gateway never import transformers or torch."""
from __future__ import annotations

import random
import subprocess
import sys

import pytest

from prorl_celery.llm.tokenizer import HFTokenizer, load_tokenizer
from tests.support.conversations import conversations, random_text, render_or_error

transformers = pytest.importorskip("transformers")

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
            text = render_or_error(ours.apply_chat_template, messages, tools, add_generation_prompt)
            expected = render_or_error(theirs.apply_chat_template, messages, tools, add_generation_prompt)
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
        text = random_text(rng)
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
