"""The hub-free fixtures: tokenizers with real ids and templates, the tiny model, the cache."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from prorl_celery.dev import devmodels

pytest_plugins = ["tests.conftest_llm"]  # also registered by tests/conftest.py

QWEN3_ADDED = {
    151643: "<|endoftext|>", 151644: "<|im_start|>", 151645: "<|im_end|>",
    151646: "<|object_ref_start|>", 151647: "<|object_ref_end|>", 151648: "<|box_start|>",
    151649: "<|box_end|>", 151650: "<|quad_start|>", 151651: "<|quad_end|>",
    151652: "<|vision_start|>", 151653: "<|vision_end|>", 151654: "<|vision_pad|>",
    151655: "<|image_pad|>", 151656: "<|video_pad|>", 151657: "<tool_call>", 151658: "</tool_call>",
    151659: "<|fim_prefix|>", 151660: "<|fim_middle|>", 151661: "<|fim_suffix|>",
    151662: "<|fim_pad|>", 151663: "<|repo_name|>", 151664: "<|file_sep|>",
    151665: "<tool_response>", 151666: "</tool_response>", 151667: "<think>", 151668: "</think>"}
QWEN3_NOT_SPECIAL = {"<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>",
                     "<think>", "</think>"}
LLAMA3_NAMED = {128000: "<|begin_of_text|>", 128001: "<|end_of_text|>",
                128004: "<|finetune_right_pad_id|>", 128006: "<|start_header_id|>",
                128007: "<|end_header_id|>", 128008: "<|eom_id|>", 128009: "<|eot_id|>",
                128010: "<|python_tag|>", 128011: "<|reserved_special_token_3|>",
                128255: "<|reserved_special_token_247|>"}


def test_qwen3_added_tokens_sit_at_their_public_ids(qwen3_hf_tokenizer):
    tok = qwen3_hf_tokenizer
    assert len(tok) == 151669
    for token_id, content in QWEN3_ADDED.items():
        assert tok.convert_ids_to_tokens(token_id) == content
        assert tok.encode(content) == [token_id]
        assert tok.added_tokens_decoder[token_id].special == (content not in QWEN3_NOT_SPECIAL)
    assert tok.encode("<think>") == [151667]
    assert tok.convert_ids_to_tokens(151657) == "<tool_call>"
    assert (tok.eos_token, tok.pad_token, tok.bos_token) == ("<|im_end|>", "<|endoftext|>", None)
    assert tok.encode("Hello world") == [9707, 1879]  # Qwen2/3's real ids, no BOS


def test_qwen3_tags_survive_skip_special_tokens(qwen3_hf_tokenizer):
    ids = qwen3_hf_tokenizer.encode("<think>hm</think><tool_call>x</tool_call><|im_end|>")
    kept = qwen3_hf_tokenizer.decode(ids, skip_special_tokens=True)
    assert kept == "<think>hm</think><tool_call>x</tool_call>"


def test_llama3_special_tokens_and_bos(llama3_hf_tokenizer):
    tok = llama3_hf_tokenizer
    assert len(tok) == 128256
    for token_id, content in LLAMA3_NAMED.items():
        assert tok.convert_ids_to_tokens(token_id) == content
        assert tok.encode(content, add_special_tokens=False) == [token_id]
    assert all(tok.added_tokens_decoder[i].special for i in range(128000, 128256))
    assert tok.encode("Hello world") == [128000, 9906, 1917]  # BOS added once, real ids
    assert (tok.eos_token, tok.bos_token) == ("<|eot_id|>", "<|begin_of_text|>")


def test_qwen3_chat_template(qwen3_hf_tokenizer):
    tok = qwen3_hf_tokenizer
    text = tok.apply_chat_template([{"role": "user", "content": "What is 2+2?"}],
                                   add_generation_prompt=True, tokenize=False)
    assert text == "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"
    ids = tok.encode(text)
    assert ids.count(151644) == 2 and ids.count(151645) == 1
    assert tok.decode(ids) == text
    # the known pitfall: history re-rendering drops <think> blocks of earlier turns
    history = [{"role": "user", "content": "a"},
               {"role": "assistant", "content": "<think>x</think>4"},
               {"role": "user", "content": "b"}]
    rendered = tok.apply_chat_template(history, add_generation_prompt=True, tokenize=False)
    assert "<think>" not in rendered and "<|im_start|>assistant\n4<|im_end|>" in rendered


def test_llama3_chat_template(llama3_hf_tokenizer):
    tok = llama3_hf_tokenizer
    text = tok.apply_chat_template([{"role": "system", "content": "Be brief."},
                                    {"role": "user", "content": "Hi"}],
                                   add_generation_prompt=True, tokenize=False)
    assert text == ("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
                    "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n"
                    "Be brief.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
                    "<|start_header_id|>assistant<|end_header_id|>\n\n")
    ids = tok.encode(text, add_special_tokens=False)  # the template already has the BOS
    assert ids[0] == 128000 and ids.count(128000) == 1
    assert ids.count(128006) == 3 and ids.count(128007) == 3 and ids.count(128009) == 2
    assert tok.decode(ids) == text


def test_builds_are_cached(qwen3_tokenizer_dir):
    assert devmodels.ensure_tokenizer("qwen3") == qwen3_tokenizer_dir
    assert qwen3_tokenizer_dir.parent == devmodels.fixtures_dir()
    assert not list(devmodels.fixtures_dir().glob(".*building-*"))
    devmodels.verify_tokenizer("qwen3", qwen3_tokenizer_dir)


def test_unknown_tokenizer_name():
    with pytest.raises(ValueError, match="qwen3"):
        devmodels.ensure_tokenizer("gpt2")


_BUILDER = """
import os, sys, time
from pathlib import Path
from prorl_celery.dev import devmodels
def build(out):
    with open(os.environ["BUILD_LOG"], "a") as log:
        log.write(f"{os.getpid()}\\n")
    time.sleep(0.3)
    (out / "done").write_text("ok")
print(devmodels._ensure("artifact", build))
"""


def test_concurrent_builds_build_once(tmp_path):
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PRORL_FIXTURES_DIR": str(tmp_path / "fx"),
           "BUILD_LOG": str(tmp_path / "log"), "PYTHONPATH": str(root)}
    procs = [subprocess.Popen([sys.executable, "-c", _BUILDER], env=env, stdout=subprocess.PIPE,
                              text=True) for _ in range(3)]
    outputs = {p.communicate(timeout=60)[0].strip() for p in procs}
    assert all(p.returncode == 0 for p in procs)
    assert outputs == {str(tmp_path / "fx" / "artifact")}
    assert len((tmp_path / "log").read_text().split()) == 1
    assert (tmp_path / "fx" / "artifact" / "done").read_text() == "ok"


def test_failed_build_leaves_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("PRORL_FIXTURES_DIR", str(tmp_path))

    def broken(out: Path) -> None:
        (out / "half").write_text("x")
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        devmodels._ensure("artifact", broken)
    assert [p.name for p in tmp_path.iterdir()] == [".artifact.lock"]


def test_tiny_model_builds_and_loads(tiny_model_dir):
    torch = pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    assert type(model).__name__ == "Qwen2ForCausalLM"
    assert model.config.hidden_size == 64 and model.config.num_hidden_layers == 2
    assert model.config.vocab_size >= len(tok) and model.config.vocab_size % 128 == 0
    assert model.config.max_position_embeddings == 4096 and model.config.tie_word_embeddings
    generation = json.loads((tiny_model_dir / "generation_config.json").read_text())
    assert generation["eos_token_id"] == tok.eos_token_id == 151645
    assert (tiny_model_dir / "model.safetensors").stat().st_size < 25_000_000
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([tok.encode("Hello")])).logits
    assert logits.shape[-1] == model.config.vocab_size


def test_vllm_model_answers_its_problems_greedily():
    """The fine-tuned model vLLM serves: head_dim 64 (vLLM's CPU attention refuses 16), and
    greedy decoding (argmax at every model position, whole vocabulary) is exactly the tool
    call turn and the boxed answer turn of each SFT conversation."""
    torch = pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM

    path = devmodels.ensure_vllm_model("qwen3")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    assert model.config.hidden_size // model.config.num_attention_heads == 64
    sequences = devmodels.sft_sequences(devmodels.ensure_tokenizer("qwen3"))
    assert len(sequences) == len(devmodels.SFT_PROBLEMS) == len(devmodels.sft_instances())
    for ids, mask in sequences:
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([ids])).logits[0]
        model_positions = [j for j in range(1, len(ids)) if mask[j]]
        predicted = logits[[j - 1 for j in model_positions]].argmax(-1).tolist()
        assert predicted == [ids[j] for j in model_positions]
