"""A prompt is encoded piece by piece between added tokens, each piece's ids cached
(``tokenizer.PieceEncoder``): the ids are exactly transformers' for the whole text, on the first
encode and on every one served from the cache; tokenizers whose added tokens or pre-tokenizer
look across a piece encode whole texts."""
from __future__ import annotations

import random
from types import SimpleNamespace

import pytest

from prorl_celery.llm.tokenizer import ChatTokenizer, HFTokenizer, PieceEncoder
from tests.support.conversations import conversations, random_text, render_or_error

transformers = pytest.importorskip("transformers")


@pytest.mark.parametrize("name", ["qwen3", "llama3"])
def test_piecewise_ids_are_transformers_ids_of_the_wholerandom_text(name: str, qwen3_tokenizer: str,
                                                              llama3_tokenizer: str) -> None:
    path = qwen3_tokenizer if name == "qwen3" else llama3_tokenizer
    ours = ChatTokenizer(HFTokenizer(path), name=name)
    theirs = transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)
    assert ours._pieces is not None
    rng = random.Random(11)
    texts = [random_text(rng) for _ in range(200)]
    # special-token text right beside, inside and between pieces, whitespace on either side
    specials = sorted(str(t) for t in theirs.added_tokens_encoder)
    gaps = ["", " ", "\n", "  x"]
    texts += [random_text(rng) + rng.choice(specials) + rng.choice(gaps) + random_text(rng) + rng.choice(specials)
              for _ in range(200)]
    for messages, tools in conversations(60, seed=23, single_tool_call=name == "llama3"):
        text = render_or_error(theirs.apply_chat_template, messages, tools, True)
        if not text.startswith("<error"):
            texts.append(text)
    expected = [theirs.encode(text, add_special_tokens=False) for text in texts]
    assert [ours.encode(text) for text in texts] == expected
    assert ours._pieces._cache  # the pieces were kept
    assert [ours.encode(text) for text in reversed(texts)] == expected[::-1]  # now from the cache


def test_a_tokenizer_whose_added_tokens_or_pre_tokenizer_look_across_pieces_is_encoded_whole() -> None:
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers

    def tokenizer(*added: AddedToken, metaspace: bool = False) -> SimpleNamespace:
        backend = Tokenizer(models.WordLevel({"a": 0, "b": 1, "[UNK]": 2}, unk_token="[UNK]"))
        backend.pre_tokenizer = pre_tokenizers.Metaspace() if metaspace else pre_tokenizers.Whitespace()
        backend.add_special_tokens(list(added))
        return SimpleNamespace(_tokenizer=backend)

    assert PieceEncoder.of(tokenizer(AddedToken("<s>", normalized=False))) is not None
    for refused in (AddedToken("<s>", lstrip=True, normalized=False), AddedToken("<s>", rstrip=True, normalized=False),
                    AddedToken("<s>", single_word=True, normalized=False), AddedToken("<s>", normalized=True)):
        assert PieceEncoder.of(tokenizer(refused)) is None, refused
    assert PieceEncoder.of(tokenizer(AddedToken("<s>", normalized=False), metaspace=True)) is None
