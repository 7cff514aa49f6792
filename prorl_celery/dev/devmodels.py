"""Test and demo fixtures built without a model hub: real tokenizers and a tiny random model.

Nothing here is committed; everything is built once into :func:`fixtures_dir` and reused.

* ``ensure_tokenizer("qwen3" | "llama3")``: a ``transformers`` tokenizer directory with the
  model's real vocabulary, special/added tokens at their public ids and its real chat
  template. The vocabularies and templates come from the llama.cpp test files vendored in
  the ``llama-cpp-python`` sdist on PyPI (``pip download``; no Hugging Face hub).
* ``ensure_tiny_model("qwen3")``: a seeded, randomly initialised ``Qwen2ForCausalLM`` of a
  few MB saved beside its tokenizer, for the CPU reference server (needs ``torch``).
* ``ensure_vllm_model("qwen3")``: a tiny ``Qwen2ForCausalLM`` vLLM's CPU backend accepts
  (head_dim 64), briefly fine-tuned (seeded, under a minute on CPU) to solve :data:`SFT_PROBLEMS` the
  way the ``math`` agent loop expects: a Hermes ``<tool_call>`` running python, then, after
  the tool's output, a ``\\boxed{}`` answer. Greedy decoding reproduces those two turns.

Builds are idempotent and safe across processes: each artifact is built under an exclusive
``flock`` into a temporary sibling directory that is renamed into place only when complete,
so a directory that exists is always whole.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from prorl_celery.core.settings import dev_settings

LLAMACPP_VERSION = "0.3.36"
#: bump when the layout of a built artifact changes, so stale caches are not reused
FORMAT_VERSION = 1

#: file name -> (path inside the sdist below its top directory, sha256)
_VOCAB_FILES = {
    "ggml-vocab-qwen2.gguf": (
        "vendor/llama.cpp/models/ggml-vocab-qwen2.gguf",
        "44c2f46b715f585c6ab513970e8a006bfa5badd6108560054921cf598d154d8c"),
    "ggml-vocab-llama-bpe.gguf": (
        "vendor/llama.cpp/models/ggml-vocab-llama-bpe.gguf",
        "97272e430d53bc7688f52d5e0ad8ea8f163ede9f1bbd1694feaa504797d5d96e"),
    "Qwen-Qwen3-0.6B.jinja": (
        "vendor/llama.cpp/models/templates/Qwen-Qwen3-0.6B.jinja",
        "87a2728cb8dc9fe424d624542f6060ec05a1d285ebbec578bb078900e33396b5"),
    "meta-llama-Llama-3.1-8B-Instruct.jinja": (
        "vendor/llama.cpp/models/templates/meta-llama-Llama-3.1-8B-Instruct.jinja",
        "e10ca381b1ccc5cf9db52e371f3b6651576caee0a630b452e2816b2d404d4b65"),
}


@dataclass(frozen=True)
class _TokenizerSpec:
    gguf: str
    template: str
    #: (id, content, special) for every id from ``first_added`` on, in order
    added: tuple[tuple[int, str, bool], ...]
    config: dict
    #: the BOS token the post-processor prepends, or None
    bos: str | None

    @property
    def first_added(self) -> int:
        return self.added[0][0]


def _qwen3_added() -> tuple[tuple[int, str, bool], ...]:
    names = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>",
             "<|object_ref_end|>", "<|box_start|>", "<|box_end|>", "<|quad_start|>",
             "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>",
             "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>", "<|fim_prefix|>",
             "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>",
             "<tool_response>", "</tool_response>", "<think>", "</think>"]
    # as in Qwen3's tokenizer_config: the tool/think tags are added but not special, so
    # they survive decode(skip_special_tokens=True)
    return tuple((151643 + i, name, name.startswith("<|")) for i, name in enumerate(names))


def _llama3_added() -> tuple[tuple[int, str, bool], ...]:
    # the Llama 3.1 layout (the 3.0 vocab file has reserved tokens where 3.1 put eom/python)
    named = {128000: "<|begin_of_text|>", 128001: "<|end_of_text|>",
             128002: "<|reserved_special_token_0|>", 128003: "<|reserved_special_token_1|>",
             128004: "<|finetune_right_pad_id|>", 128005: "<|reserved_special_token_2|>",
             128006: "<|start_header_id|>", 128007: "<|end_header_id|>", 128008: "<|eom_id|>",
             128009: "<|eot_id|>", 128010: "<|python_tag|>"}
    names = [named.get(i, f"<|reserved_special_token_{i - 128008}|>")
             for i in range(128000, 128256)]
    return tuple((128000 + i, name, True) for i, name in enumerate(names))


_SPECS = {
    "qwen3": _TokenizerSpec(
        gguf="ggml-vocab-qwen2.gguf", template="Qwen-Qwen3-0.6B.jinja", added=_qwen3_added(),
        bos=None,
        config={"tokenizer_class": "Qwen2Tokenizer", "bos_token": None, "eos_token": "<|im_end|>",
                "pad_token": "<|endoftext|>", "unk_token": None, "add_bos_token": False,
                "add_prefix_space": False, "clean_up_tokenization_spaces": False,
                "errors": "replace", "split_special_tokens": False, "model_max_length": 131072}),
    "llama3": _TokenizerSpec(
        gguf="ggml-vocab-llama-bpe.gguf", template="meta-llama-Llama-3.1-8B-Instruct.jinja",
        added=_llama3_added(), bos="<|begin_of_text|>",
        config={"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|begin_of_text|>",
                "eos_token": "<|eot_id|>", "pad_token": None, "add_bos_token": True,
                "add_eos_token": False, "clean_up_tokenization_spaces": False,
                "model_max_length": 131072}),
}
TOKENIZER_NAMES = tuple(_SPECS)


def fixtures_dir() -> Path:
    """Where fixtures are cached: ``$PRORL_FIXTURES_DIR`` or ``~/.cache/prorl-celery/fixtures``."""
    configured = dev_settings().fixtures_dir
    return Path(configured) if configured else Path.home() / ".cache" / "prorl-celery" / "fixtures"


def _say(message: str) -> None:
    print(f"[prorl fixtures] {message}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _ensure(name: str, build: Callable[[Path], None]) -> Path:
    """Return ``fixtures_dir()/name``, building it exactly once across processes."""
    root = fixtures_dir()
    final = root / name
    if final.is_dir():
        return final
    root.mkdir(parents=True, exist_ok=True)
    with _locked(root / f".{name}.lock"):
        if final.is_dir():  # another process finished it while we waited
            return final
        for stale in root.glob(f".{name}.building-*"):  # left by a builder that was killed
            shutil.rmtree(stale, ignore_errors=True)
        scratch = Path(tempfile.mkdtemp(prefix=f".{name}.building-", dir=root))
        try:
            build(scratch)
            for path in [scratch, *scratch.rglob("*")]:  # mkdtemp and safetensors make them private
                path.chmod(0o755 if path.is_dir() else 0o644)
            os.rename(scratch, final)
        except BaseException:
            shutil.rmtree(scratch, ignore_errors=True)
            raise
    return final


# ----------------------------------------------------------------------------- vocab files


def _vocab_files() -> Path:
    return _ensure(f"llamacpp-{LLAMACPP_VERSION}-vocab", _extract_vocab_files)


def _extract_vocab_files(out: Path) -> None:
    configured = dev_settings().llamacpp_sdist
    if configured:
        _extract_from_sdist(Path(configured), out)
        return
    with tempfile.TemporaryDirectory(prefix=".sdist-", dir=out) as download:
        _say(f"downloading the llama-cpp-python=={LLAMACPP_VERSION} sdist from PyPI (~77 MB)")
        command = [sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps",
                   f"llama-cpp-python=={LLAMACPP_VERSION}", "-d", download]
        subprocess.run(command, check=True, stdout=sys.stderr)
        archives = sorted(Path(download).glob("llama_cpp_python-*.tar.gz"))
        if not archives:
            raise RuntimeError(f"pip download left no llama-cpp-python sdist in {download}")
        _extract_from_sdist(archives[0], out)


def _extract_from_sdist(sdist: Path, out: Path) -> None:
    _say(f"extracting vocabularies and chat templates from {sdist}")
    wanted = {inner: name for name, (inner, _) in _VOCAB_FILES.items()}
    with tarfile.open(sdist, "r:gz") as archive:
        for member in archive:
            inner = member.name.split("/", 1)[-1]
            if inner in wanted and member.isfile():
                source = archive.extractfile(member)
                assert source is not None
                (out / wanted[inner]).write_bytes(source.read())
    for name, (_, digest) in _VOCAB_FILES.items():
        path = out / name
        if not path.is_file():
            raise RuntimeError(f"{sdist} has no {_VOCAB_FILES[name][0]}: not llama-cpp-python "
                               f"{LLAMACPP_VERSION}?")
        if hashlib.sha256(path.read_bytes()).hexdigest() != digest:
            raise RuntimeError(f"{name} from {sdist} does not match the pinned sha256")


# ----------------------------------------------------------------------------- tokenizers


def ensure_tokenizer(name: str) -> Path:
    """A directory loadable offline with ``AutoTokenizer.from_pretrained`` ("qwen3" or "llama3")."""
    if name not in _SPECS:
        raise ValueError(f"unknown tokenizer {name!r}; one of {', '.join(TOKENIZER_NAMES)}")
    spec = _SPECS[name]
    return _ensure(f"tokenizer-{name}-v{FORMAT_VERSION}",
                   lambda out: _build_tokenizer(name, spec, _vocab_files(), out))


def _build_tokenizer(name: str, spec: _TokenizerSpec, vocab: Path, out: Path) -> None:
    from transformers import AutoTokenizer

    _say(f"building the {name} tokenizer from {spec.gguf} (takes ~15 s)")
    raw = AutoTokenizer.from_pretrained(vocab, gguf_file=spec.gguf)
    with tempfile.TemporaryDirectory(prefix=".raw-", dir=out) as scratch:
        raw.save_pretrained(scratch)
        data = json.loads((Path(scratch) / "tokenizer.json").read_text())
    _patch_tokenizer_json(data, spec)
    (out / "tokenizer.json").write_text(json.dumps(data, ensure_ascii=False))
    config = dict(spec.config)
    config["added_tokens_decoder"] = {
        str(i): {"content": c, "lstrip": False, "normalized": False, "rstrip": False,
                 "single_word": False, "special": s} for i, c, s in spec.added}
    config["chat_template"] = (vocab / spec.template).read_text()
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False))
    special_map = {"eos_token": config["eos_token"]}
    special_map.update({k: config[k] for k in ("bos_token", "pad_token") if config.get(k)})
    (out / "special_tokens_map.json").write_text(json.dumps(special_map, indent=2))
    verify_tokenizer(name, out)


def _patch_tokenizer_json(data: dict, spec: _TokenizerSpec) -> None:
    """Added tokens at their public ids; the BPE vocabulary proper ends below them."""
    vocab = data["model"]["vocab"]
    data["model"]["vocab"] = {piece: i for piece, i in vocab.items() if i < spec.first_added}
    data["added_tokens"] = [
        {"id": i, "content": content, "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": special} for i, content, special in spec.added]
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                  "use_regex": False}
    if spec.bos is None:
        data["normalizer"] = {"type": "NFC"}
        data["post_processor"] = byte_level
        return
    bos_id = next(i for i, content, _ in spec.added if content == spec.bos)
    bos = {"SpecialToken": {"id": spec.bos, "type_id": 0}}
    data["post_processor"] = {"type": "Sequence", "processors": [
        {**byte_level, "add_prefix_space": True, "use_regex": True},
        {"type": "TemplateProcessing",
         "single": [bos, {"Sequence": {"id": "A", "type_id": 0}}],
         "pair": [bos, {"Sequence": {"id": "A", "type_id": 0}},
                  {"SpecialToken": {"id": spec.bos, "type_id": 1}},
                  {"Sequence": {"id": "B", "type_id": 1}}],
         "special_tokens": {spec.bos: {"id": spec.bos, "ids": [bos_id], "tokens": [spec.bos]}}},
    ]}


def verify_tokenizer(name: str, path: Path) -> None:
    """Raise ``RuntimeError`` unless the tokenizer at ``path`` behaves like the real ``name``."""
    from transformers import AutoTokenizer

    spec = _SPECS[name]
    tok = AutoTokenizer.from_pretrained(path)
    problems = []
    for token_id, content, _ in spec.added:
        if tok.convert_tokens_to_ids(content) != token_id or tok.encode(
                content, add_special_tokens=False) != [token_id]:
            problems.append(f"{content} is not the single id {token_id}")
    if len(tok) != spec.added[-1][0] + 1:
        problems.append(f"len(tokenizer) is {len(tok)}, expected {spec.added[-1][0] + 1}")
    if tok.eos_token != spec.config["eos_token"]:
        problems.append(f"eos_token is {tok.eos_token!r}")
    probe = [{"role": "user", "content": "Hi there"}]
    text = tok.apply_chat_template(probe, add_generation_prompt=True, tokenize=False)
    assert isinstance(text, str)  # tokenize=False renders text
    expected_tail = {"qwen3": "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
                     "llama3": "<|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>"
                               "<|start_header_id|>assistant<|end_header_id|>\n\n"}[name]
    if not text.endswith(expected_tail):
        problems.append(f"chat template renders {text!r}")
    ids = tok.encode(text, add_special_tokens=False)
    if tok.decode(ids) != text:
        problems.append("decode(encode(rendered chat)) is not the rendered chat")
    first = tok.encode("Hello world")
    bos_id = tok.convert_tokens_to_ids(spec.bos) if spec.bos else None
    if (first[0] == bos_id) != (bos_id is not None) or first.count(bos_id) > 1:
        problems.append(f"BOS handling is wrong: encode('Hello world') = {first}")
    if problems:
        raise RuntimeError(f"{name} tokenizer at {path} is wrong: " + "; ".join(problems))


# ----------------------------------------------------------------------------- tiny model


def ensure_tiny_model(tokenizer: str = "qwen3") -> Path:
    """A seeded, randomly initialised ``Qwen2ForCausalLM`` of a few MB beside its tokenizer.

    The directory holds the model (safetensors), ``generation_config.json`` (eos = the
    tokenizer's eos) and the tokenizer files, so one path serves ``AutoModelForCausalLM`` and
    ``AutoTokenizer``. Needs ``torch`` (the ``model`` extra).
    """
    tokenizer_dir = ensure_tokenizer(tokenizer)
    return _ensure(f"tiny-qwen2-{tokenizer}-v{FORMAT_VERSION}",
                   lambda out: _build_tiny_model(tokenizer_dir, out))


def _build_tiny_model(tokenizer_dir: Path, out: Path) -> None:
    try:
        import torch
    except ImportError as error:
        raise RuntimeError("the tiny model needs torch: pip install 'prorl-celery[model]'") \
            from error
    from transformers import AutoTokenizer, GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    _say(f"building a tiny random Qwen2 model in {out.parent}")
    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    vocab_size = -(-len(tok) // 128) * 128  # padded like real checkpoints
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    config = Qwen2Config(
        vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
        # rope_theta: taken by **kwargs (transformers 5 moves it into rope_parameters, 4.x knows only it)
        tie_word_embeddings=True, rope_theta=1_000_000.0, eos_token_id=tok.eos_token_id,  # type: ignore[call-arg]
        bos_token_id=tok.bos_token_id, pad_token_id=pad_id,
        # a larger init than 0.02 so the next-token distribution is peaked, not uniform
        initializer_range=0.2)
    torch.manual_seed(0)
    # bf16 halves the file; transformers' decorator on .to types its argument as the model
    model = Qwen2ForCausalLM(config).to(torch.bfloat16).eval()  # type: ignore[arg-type]
    model.generation_config = GenerationConfig(eos_token_id=tok.eos_token_id, pad_token_id=pad_id,
                                               bos_token_id=tok.bos_token_id)
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)


# ----------------------------------------------------------------------------- vLLM model

#: (problem, answer, python code, boxed answer) the fine-tuned model solves with one tool call;
#: the first is the tests' problem, the others are the first six of ``handlers/math`` samples
#: (so ``prorl demo --llm vllm`` gets right answers)
SFT_PROBLEMS: tuple[tuple[str, str, str, str], ...] = (
    ("What is 6 times 7?", "42", "print(6*7)", "42"),
    ("Compute $17 \\times 23 - 191$.", "200", "print(17*23 - 191)", "200"),
    ("What is $\\frac{2}{3} + \\frac{1}{12}$? Express your answer as a common fraction.", "\\frac{3}{4}",
     "from fractions import Fraction\nprint(Fraction(2, 3) + Fraction(1, 12))", "\\frac{3}{4}"),
    ("Simplify $\\sqrt{50} - \\sqrt{18}$.", "2\\sqrt{2}", "print(50**0.5 - 18**0.5, 2*2**0.5)", "2\\sqrt{2}"),
    ("Solve for $x$: $3x - 7 = 2x + 5$.", "12", "print(5 + 7)", "12"),
    ("Find all real numbers $x$ such that $x^2 - 5x + 6 = 0$. List them separated by commas.", "2, 3",
     "print([x for x in range(-10, 11) if x*x - 5*x + 6 == 0])", "2, 3"),
    ("Let $f(x) = x^2 - 2x + 2$. Write $f(x+1)$ as a polynomial in $x$.", "x^2+1",
     "print([(x+1)**2 - 2*(x+1) + 2 - (x*x + 1) for x in range(5)])", "x^2+1"),
)
#: the math instance fields the model was trained under (tools described, room for both turns)
SFT_INSTANCE = {"data_source": "math", "tools": ["python"], "max_iterations": 3}
#: bump when SFT_PROBLEMS, the prompt format or the architecture change
VLLM_MODEL_VERSION = 1


def sft_instances() -> list[dict]:
    """The math instances of :data:`SFT_PROBLEMS`, as a job posts them."""
    return [{"problem": p, "answer": a, **SFT_INSTANCE} for p, a, _, _ in SFT_PROBLEMS]


def ensure_vllm_model(tokenizer: str = "qwen3") -> Path:
    """A tiny Qwen2 (hidden 128, 2 heads of 64, 2 layers, float32) that vLLM's CPU backend
    serves, fine-tuned on :data:`SFT_PROBLEMS`; its tokenizer files beside it. Needs ``torch``.

    vLLM's CPU attention refuses head_dim 16 (the random tiny model), hence a model of its own.
    """
    tokenizer_dir = ensure_tokenizer(tokenizer)
    return _ensure(f"tiny-qwen2-{tokenizer}-sft-v{VLLM_MODEL_VERSION}",
                   lambda out: _build_vllm_model(tokenizer_dir, out))


def sft_sequences(tokenizer_dir: Path, problems=None) -> list[tuple[list[int], list[int]]]:
    """(ids, mask) of each SFT conversation exactly as the ``math`` agent loop builds it: the
    prompt rendered with the python tool, the tool call turn, the tool observation (the output
    of the code, run here), the answer turn; mask 1 on the model's tokens. ``problems``:
    ``(problem, answer, code, boxed)`` tuples like :data:`SFT_PROBLEMS` (the default)."""
    import io
    from contextlib import redirect_stdout

    from handlers.agent import AgentLoop
    from handlers.math.instances import normalize_instance
    from handlers.sandbox_tools import PYTHON
    from handlers.tool_calls import tool_call
    from prorl_celery.llm.tokenizer import load_tokenizer

    chat = load_tokenizer(str(tokenizer_dir))
    schemas = AgentLoop(tools=[PYTHON], finish_tool=False).tool_schemas()
    sequences = []
    problems = SFT_PROBLEMS if problems is None else problems
    instances = [{"problem": p, "answer": a, **SFT_INSTANCE} for p, a, _, _ in problems]
    for instance, (_, _, code, boxed) in zip(instances, problems):
        printed = io.StringIO()
        with redirect_stdout(printed):
            exec(code, {})  # noqa: S102 - our own constant snippets
        observation = printed.getvalue().rstrip()  # what the python tool returns
        ids = chat.prompt_ids(normalize_instance(instance).messages, schemas)
        mask = [0] * len(ids)
        call = tool_call("python", code=code)
        answer = f"The code prints {observation.splitlines()[0]}, so the answer is $\\boxed{{{boxed}}}$."
        for part, role in ((chat.encode(call) + [chat.eot_id], 1),
                           (chat.observation_ids({"role": "tool", "content": observation}, schemas), 0),
                           (chat.encode(answer) + [chat.eot_id], 1)):
            ids += part
            mask += [role] * len(part)
        sequences.append((ids, mask))
    return sequences


def sft_batch(sequences: list[tuple[list[int], list[int]]], pad_id: int) -> tuple[Any, Any, Any]:
    """Padded ``(input_ids, attention_mask, labels)`` tensors for causal-LM SFT on ``(ids, mask)``
    sequences: only the model's tokens (mask 1) are labels, -100 elsewhere."""
    import torch

    width = max(len(ids) for ids, _ in sequences)
    inputs = torch.full((len(sequences), width), pad_id)
    attention = torch.zeros((len(sequences), width), dtype=torch.long)
    labels = torch.full((len(sequences), width), -100)
    for row, (ids, mask) in enumerate(sequences):
        inputs[row, :len(ids)] = torch.tensor(ids)
        attention[row, :len(ids)] = 1
        for j in range(1, len(ids)):
            if mask[j]:
                labels[row, j - 1] = ids[j]  # position j-1 predicts model token j
    return inputs, attention, labels


def _build_vllm_model(tokenizer_dir: Path, out: Path, max_steps: int = 600) -> None:
    try:
        import torch
    except ImportError as error:
        raise RuntimeError("the tiny vLLM model needs torch: pip install 'prorl-celery[model]'") \
            from error
    from transformers import AutoTokenizer, GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    _say(f"fine-tuning a tiny Qwen2 model for vLLM in {out.parent} (under a minute)")
    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    vocab_size = -(-len(tok) // 128) * 128
    config = Qwen2Config(
        vocab_size=vocab_size, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=4096,
        # rope_theta: taken by **kwargs (transformers 5 moves it into rope_parameters, 4.x knows only it)
        tie_word_embeddings=True, rope_theta=1_000_000.0, eos_token_id=tok.eos_token_id,  # type: ignore[call-arg]
        bos_token_id=tok.bos_token_id, pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config)
    inputs, attention, labels = sft_batch(sft_sequences(tokenizer_dir), tok.pad_token_id)
    chosen = labels != -100
    targets = labels[chosen]
    used = torch.unique(inputs[attention.bool()])
    weight = model.model.embed_tokens.weight  # tied: also the output layer
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    noise = torch.Generator().manual_seed(0)

    def check() -> tuple[bool, float]:
        """Greedy = the targets at every model position (full vocabulary), worst logprob."""
        with torch.no_grad():
            hidden = model.model(input_ids=inputs, attention_mask=attention).last_hidden_state[chosen]
            logprobs = torch.log_softmax(model.lm_head(hidden), -1)
        return bool((logprobs.argmax(-1) == targets).all()), float(logprobs.gather(1, targets[:, None]).min())

    # the softmax runs over the tokens of the data plus 8192 others drawn afresh each step (the
    # full 152k-way softmax would cost 4x more per step); check() uses the full vocabulary
    for step in range(1, max_steps + 1):
        candidates = torch.unique(torch.cat([used, torch.randint(0, vocab_size, (8192,), generator=noise)]))
        index = torch.full((vocab_size,), -1)
        index[candidates] = torch.arange(len(candidates))
        hidden = model.model(input_ids=inputs, attention_mask=attention).last_hidden_state[chosen]
        loss = torch.nn.functional.cross_entropy(hidden @ weight[candidates].T, index[targets])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 20 == 0:
            greedy, worst = check()
            if greedy and worst > -0.2:  # a clear margin: float32 engines agree on the argmax
                _say(f"fine-tuned in {step} steps (worst target logprob {worst:.3f})")
                break
    else:
        raise RuntimeError(f"the tiny vLLM model did not learn its {len(inputs)} conversations "
                           f"in {max_steps} steps (greedy={greedy}, worst logprob {worst:.3f})")
    model.eval()
    model.generation_config = GenerationConfig(eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                                               bos_token_id=tok.bos_token_id)
    model.save_pretrained(out, safe_serialization=True)  # float32: what vLLM and the test reload
    tok.save_pretrained(out)
    (out / "prorl_sft.json").write_text(json.dumps(
        {"problems": [list(p) for p in SFT_PROBLEMS], "instance": SFT_INSTANCE, "steps": step,
         "worst_logprob": worst}, indent=2))


# ----------------------------------------------------------------------------- command line


@click.group("fixtures")
def fixtures() -> None:
    """Build the hub-free test fixtures (tokenizers, tiny model) into the fixtures cache."""


@fixtures.command("build")
@click.option("--model/--no-model", default=True, show_default=True,
              help="also build the tiny models, random and fine-tuned for vLLM (need torch)")
def build_command(model: bool) -> None:
    """Build (or find cached) tokenizers and the tiny model; print their paths."""
    for name in TOKENIZER_NAMES:
        click.echo(f"tokenizer {name}: {ensure_tokenizer(name)}")
    if model:
        click.echo(f"tiny model qwen3: {ensure_tiny_model('qwen3')}")
        click.echo(f"tiny vLLM model qwen3: {ensure_vllm_model('qwen3')}")


@fixtures.command("path")
def path_command() -> None:
    """Print the fixtures cache directory."""
    click.echo(str(fixtures_dir()))


if __name__ == "__main__":
    fixtures()
