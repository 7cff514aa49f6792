"""The service's tokenizer: chat-template rendering and observation suffixes.

Earlier turns are never re-tokenized. A new observation is tokenized by rendering a fixed
probe conversation with and without it and keeping only the text after the probe's last
end-of-turn token: templates that rewrite earlier turns (Qwen3 drops old ``<think>`` blocks)
cannot change what lies after that token.

Light on purpose: a worker or gateway never imports ``transformers`` (it pulls in torch, a
quarter of a gigabyte and seconds of start-up). A tokenizer directory is read with the
``tokenizers`` library (``tokenizer.json``) and its chat template rendered with jinja2 exactly
as ``transformers``' ``apply_chat_template`` renders it: the same sandboxed environment
(``trim_blocks``, ``lstrip_blocks``, ``loopcontrols``, the ``generation`` tag), the same
``tojson`` filter, ``raise_exception``, ``strftime_now``, ``dict`` and ``namespace`` globals, the
special tokens of ``tokenizer_config.json`` as variables, messages normalized the same way
(keys whose value is None dropped, reasoning fields aliased). ``tests/integration/test_tokenizer_light.py``
checks rendering, encoding and decoding against ``transformers`` on the project's tokenizers.
"""
from __future__ import annotations

import json
import re
import threading
from collections import OrderedDict
from collections.abc import Mapping
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

#: leading-message renderings a tokenizer keeps (``ChatTokenizer.message_ends``)
PREFIX_CACHE_SIZE = 256
#: characters of text pieces between added tokens whose ids a tokenizer keeps (``PieceEncoder``;
#: a few MB with the ids); a piece longer than an eighth of it is never kept
PIECE_CACHE_CHARS = 1_000_000
_PROBE = [{"role": "user", "content": "probe"}, {"role": "assistant", "content": "probe"}]
_SPECIAL_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
#: names a message's reasoning is passed under; templates read the first (as transformers does)
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


class HFTokenizer:
    """The part of a Hugging Face tokenizer's interface the service uses, over ``tokenizers``.

    ``encode(text, add_special_tokens=True)`` and ``decode(ids, skip_special_tokens=False)``
    behave as ``PreTrainedTokenizerFast``'s; ``apply_chat_template(..., tokenize=False)`` as its
    ``apply_chat_template``.
    """

    # set in __init__ from the special tokens map, one attribute per name of _SPECIAL_NAMES
    bos_token: str | None
    eos_token: str | None
    unk_token: str | None
    sep_token: str | None
    pad_token: str | None
    cls_token: str | None
    mask_token: str | None

    def __init__(self, path: str | Path) -> None:
        from tokenizers import Tokenizer

        self.name_or_path = str(path)
        directory = Path(path)
        self.config: dict[str, Any] = _read_json(directory / "tokenizer_config.json") or {}
        special_map = _read_json(directory / "special_tokens_map.json") or {}
        self._tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
        self._tokenizer.no_truncation()
        self._tokenizer.no_padding()
        self.chat_template = _chat_template(directory, self.config)
        self.clean_up_tokenization_spaces = bool(self.config.get("clean_up_tokenization_spaces", False))
        #: the named special tokens, as transformers' ``special_tokens_map`` (the template sees them)
        self.special_tokens_map: dict[str, str] = {}
        for name in _SPECIAL_NAMES:
            value = self.config[name] if name in self.config else special_map.get(name)
            value = _token_content(value)
            if value is not None:
                self.special_tokens_map[name] = value
        for name in _SPECIAL_NAMES:
            setattr(self, name, self.special_tokens_map.get(name))

    # -- ids and tokens

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self._tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = False,
               clean_up_tokenization_spaces: bool | None = None) -> str:
        text = self._tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)
        clean = (self.clean_up_tokenization_spaces if clean_up_tokenization_spaces is None
                 else clean_up_tokenization_spaces)
        return clean_up_tokenization(text) if clean else text

    def convert_tokens_to_ids(self, token: str) -> int | None:
        return self._tokenizer.token_to_id(token)

    def convert_ids_to_tokens(self, token_id: int) -> str | None:
        return self._tokenizer.id_to_token(token_id)

    @property
    def eos_token_id(self) -> int | None:
        return self.convert_tokens_to_ids(self.eos_token) if self.eos_token else None

    def __len__(self) -> int:
        return self._tokenizer.get_vocab_size(with_added_tokens=True)

    # -- chat template

    def apply_chat_template(self, conversation: list[dict[str, Any]], tools: list[dict] | None = None,
                            add_generation_prompt: bool = False, tokenize: bool = True,
                            documents: list[dict] | None = None, **kwargs: Any) -> str | list[int]:
        if self.chat_template is None:
            raise ValueError(f"tokenizer {self.name_or_path!r} has no chat template")
        if not conversation:
            raise ValueError("Cannot apply chat template to an empty conversation. Provide at least one message.")
        template = _compile(self.chat_template)
        chat = _alias_reasoning_fields(_plain(_normalize_messages(conversation)))
        rendered = template.render(messages=chat, tools=_plain(tools), documents=_plain(documents),
                                   add_generation_prompt=add_generation_prompt,
                                   **_plain({**self.special_tokens_map, **kwargs}))
        return self.encode(rendered, add_special_tokens=False) if tokenize else rendered


class ChatTokenizer:
    """A tokenizer with the operations a token-level trajectory needs."""

    def __init__(self, tokenizer: Any, name: str = "") -> None:
        if tokenizer.chat_template is None:
            raise ValueError(f"tokenizer {name!r} has no chat template")
        #: ``HFTokenizer`` (or a transformers tokenizer): ``.encode(text, add_special_tokens=...)``,
        #: ``.decode(ids, skip_special_tokens=...)``, ``.apply_chat_template(...)``
        self.hf = tokenizer
        self.name = name
        self.eot_token: str = tokenizer.eos_token
        self.eot_id: int = tokenizer.convert_tokens_to_ids(self.eot_token)
        # one instance is shared by a worker's threads; callers that reach ``hf`` take this lock too
        self._lock = threading.Lock()
        self._probe_cache: dict[str, int] = {}
        #: ids of rendered leading messages (system prompts, few-shot turns), which every job of
        #: a task shares: rendering them again cost a RUN worker 7 % of its time in a burst
        self._prefix_cache: OrderedDict[str, list[int]] = OrderedDict()
        # a template that reads the clock renders a prefix differently from one day to the next
        self._prefix_cacheable = "strftime_now" not in (tokenizer.chat_template or "")
        self._pieces = PieceEncoder.of(tokenizer)

    def render(self, messages: list[dict[str, Any]], tools: list[dict] | None = None,
               add_generation_prompt: bool = False) -> str:
        with self._lock:
            return self.hf.apply_chat_template(
                messages, tools=tools, tokenize=False, add_generation_prompt=add_generation_prompt
            )

    def encode(self, text: str) -> list[int]:
        """Ids of text that already carries its special tokens (rendered by the template)."""
        with self._lock:
            if self._pieces is not None:
                return self._pieces.encode(text)
            return self.hf.encode(text, add_special_tokens=False)

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        with self._lock:
            return self.hf.decode(ids, skip_special_tokens=skip_special_tokens)

    def prompt_ids(self, messages: list[dict[str, Any]], tools: list[dict] | None = None) -> list[int]:
        return self.encode(self.render(messages, tools, add_generation_prompt=True))

    def message_ends(self, messages: list[dict[str, Any]], prompt_ids: list[int],
                     tools: list[dict] | None = None) -> list[int]:
        """Where each first message's tokens end in ``prompt_ids``; the last one ends with the
        generation prompt. A message whose own rendering is not a token prefix of the prompt
        (a template that adds a preamble only once it sees later turns) shares the next
        message's end, so every token still belongs to exactly one message."""
        ends = []
        for count in range(1, len(messages)):
            ids = self._prefix_ids(messages[:count], tools)
            prefix = len(ids) if prompt_ids[:len(ids)] == ids else -1
            ends.append(prefix)
        ends.append(len(prompt_ids))
        for index in range(len(ends) - 2, -1, -1):  # an unmatched end takes the next one
            if ends[index] < 0 or ends[index] > ends[index + 1]:
                ends[index] = ends[index + 1]
        return ends

    def _prefix_ids(self, messages: list[dict[str, Any]], tools: list[dict] | None) -> list[int]:
        """``encode(render(messages, tools))``, from the cache when these leading messages were
        rendered before."""
        if not self._prefix_cacheable:
            return self.encode(self.render(messages, tools))
        try:
            key = json.dumps([messages, tools], sort_keys=True)
        except (TypeError, ValueError):  # not plain JSON: render it, uncached
            return self.encode(self.render(messages, tools))
        with self._lock:
            ids = self._prefix_cache.get(key)
            if ids is not None:
                self._prefix_cache.move_to_end(key)
                return ids
        ids = self.encode(self.render(messages, tools))
        with self._lock:
            self._prefix_cache[key] = ids
            if len(self._prefix_cache) > PREFIX_CACHE_SIZE:
                self._prefix_cache.popitem(last=False)
        return ids

    def observation_ids(self, message: dict[str, Any], tools: list[dict] | None = None) -> list[int]:
        """Ids to append after a model turn that ended with the end-of-turn token."""
        turns = self._probe_turns(tools)
        after = self.render(_PROBE + [message], tools, add_generation_prompt=True)
        cut = _nth_end(after, self.eot_token, turns)
        if turns == 0 or cut < 0:
            raise ValueError(f"chat template of {self.name!r} has no {self.eot_token!r} after a turn")
        return self.encode(after[cut:])


    def _probe_turns(self, tools: list[dict] | None) -> int:
        """End-of-turn tokens in the rendered probe; it depends only on the tools, so it is
        rendered once per tool set rather than once per observation."""
        key = json.dumps(tools, sort_keys=True)
        if key not in self._probe_cache:
            self._probe_cache[key] = self.render(_PROBE, tools).count(self.eot_token)
        return self._probe_cache[key]


class PieceEncoder:
    """``encode(text, add_special_tokens=False)``, text piece by text piece between added tokens,
    each piece's ids cached.

    A rendered prompt repeats most of its text from job to job (the system prompt, the
    template's role headers), and encoding is most of preparing a prompt: the pre-tokenizer's
    Unicode regex costs about 2 us a token. ``tokenizers`` itself splits a text at its added
    tokens before anything else, then normalizes, pre-tokenizes and encodes each piece between
    them on its own, so the ids of a text are the ids of its pieces and added tokens in order,
    whatever the other pieces are. That holds as long as nothing looks across a piece: an added
    token that strips the whitespace beside it (``lstrip``/``rstrip``), matches only as a whole
    word or only after normalization, or a ``Metaspace`` pre-tokenizer (its ``prepend_scheme``
    ``first`` marks only the text's first piece). ``of`` returns None for such a tokenizer,
    which then encodes whole texts as before. Not thread-safe: ``ChatTokenizer`` holds its lock."""

    def __init__(self, backend: Any, added: dict[str, int], budget: int = PIECE_CACHE_CHARS) -> None:
        self._backend = backend
        self._added = added
        # longest first: at one position the regex takes the first alternative that matches, as
        # tokenizers' leftmost-longest matcher takes the longest added token there
        self._split = re.compile("(" + "|".join(re.escape(t) for t in sorted(added, key=len, reverse=True)) + ")")
        self._cache: OrderedDict[str, list[int]] = OrderedDict()
        self._budget = budget
        self._chars = 0  # of the pieces cached

    @classmethod
    def of(cls, tokenizer: Any) -> PieceEncoder | None:
        """For ``HFTokenizer`` or a transformers fast tokenizer whose ``tokenizers`` backend
        splits at added tokens only (see the class), else None."""
        backend = getattr(tokenizer, "_tokenizer", None) or getattr(tokenizer, "backend_tokenizer", None)
        if backend is None or not hasattr(backend, "get_added_tokens_decoder"):
            return None
        added = {}
        for token_id, token in backend.get_added_tokens_decoder().items():
            if token.lstrip or token.rstrip or token.single_word or token.normalized:
                return None
            added[token.content] = token_id
        pre_tokenizer = backend.pre_tokenizer
        if not added or (pre_tokenizer is not None and b"Metaspace" in pre_tokenizer.__getstate__()):
            return None
        return cls(backend, added)

    def encode(self, text: str) -> list[int]:
        ids: list[int] = []
        for index, piece in enumerate(self._split.split(text)):
            if index % 2:  # an added token
                ids.append(self._added[piece])
            elif piece:
                ids += self._piece(piece)
        return ids

    def _piece(self, piece: str) -> list[int]:
        cached = self._cache.get(piece)
        if cached is not None:
            self._cache.move_to_end(piece)
            return cached
        ids = self._backend.encode(piece, add_special_tokens=False).ids
        if len(piece) <= self._budget // 8:
            self._cache[piece] = ids
            self._chars += len(piece)
            while self._chars > self._budget:
                self._chars -= len(self._cache.popitem(last=False)[0])
        return ids


def _nth_end(text: str, token: str, n: int) -> int:
    """Index just after the n-th occurrence of token in text, or -1."""
    index = -1
    for _ in range(n):
        index = text.find(token, index + 1)
        if index < 0:
            return -1
    return index + len(token)


_load_lock = threading.Lock()


def load_tokenizer(path: str) -> ChatTokenizer:
    """Load (once per process) a tokenizer from a local directory; never from a hub."""
    with _load_lock:  # threads asking at once must not each spend seconds loading it
        return _load(path)


@lru_cache(maxsize=16)
def _load(path: str) -> ChatTokenizer:
    if not (Path(path) / "tokenizer.json").is_file():
        raise FileNotFoundError(f"tokenizer {path!r}: no tokenizer.json in that directory (a fast tokenizer is "
                                f"required; save it with transformers' save_pretrained to get one)")
    tokenizer = ChatTokenizer(HFTokenizer(path), name=path)
    _release_freed_memory()
    return tokenizer


def _release_freed_memory() -> None:
    """Give the heap freed after parsing ``tokenizer.json`` back to the system.

    Parsing a 150k-token vocabulary allocates about twice what the loaded tokenizer keeps, and
    glibc keeps the freed part mapped: 55 MB of a RUN worker's idle RSS for Qwen3's."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to do
        pass


# -- what transformers does around the template -------------------------------------------------------

def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None


def _token_content(value: Any) -> str | None:
    """A special token as tokenizer_config.json writes it: a string, or an AddedToken dict."""
    if isinstance(value, Mapping):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _chat_template(directory: Path, config: dict[str, Any]) -> str | None:
    """``chat_template.jinja`` beside the tokenizer, else ``chat_template.json``, else the config's."""
    jinja_file = directory / "chat_template.jinja"
    if jinja_file.is_file():
        return jinja_file.read_text(encoding="utf-8")
    json_file = _read_json(directory / "chat_template.json")
    template = json_file.get("chat_template") if isinstance(json_file, dict) else config.get("chat_template")
    if isinstance(template, list):  # named templates: [{"name", "template"}]
        named = {entry["name"]: entry["template"] for entry in template}
        return named.get("default") or next(iter(named.values()), None)
    return template if isinstance(template, str) else None


def clean_up_tokenization(text: str) -> str:
    """transformers' ``clean_up_tokenization``: spaces before punctuation and contractions."""
    return (text.replace(" .", ".").replace(" ?", "?").replace(" !", "!").replace(" ,", ",")
            .replace(" ' ", "'").replace(" n't", "n't").replace(" 'm", "'m").replace(" 's", "'s")
            .replace(" 've", "'ve").replace(" 're", "'re"))


def _normalize_messages(conversation: Any) -> list[dict[str, Any]]:
    messages = []
    for message in conversation:
        if not isinstance(message, Mapping):
            raise TypeError(f"Chat messages should be dicts, but got {message!r}.")
        messages.append({key: value for key, value in message.items() if value is not None})
    return messages


def _alias_reasoning_fields(chat: list[dict[str, Any]]) -> list[dict[str, Any]]:
    aliased = []
    for message in chat:
        reasoning = next((message[k] for k in _REASONING_FIELDS if message.get(k) is not None), None)
        if reasoning is not None:
            message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
        aliased.append(message)
    return aliased


def _plain(value: Any) -> Any:
    """Only plain JSON data reaches the template (as transformers' ``_plain_template_data``)."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {_plain(key): _plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_plain(item) for item in value]
    if isinstance(value, tuple):
        return tuple(_plain(item) for item in value)
    if callable(getattr(value, "model_dump", None)):
        return _plain(value.model_dump())
    return f"<{type(value).__name__}>"


@lru_cache(maxsize=32)
def _compile(chat_template: str):
    import jinja2
    import jinja2.ext
    import jinja2.nodes
    import jinja2.utils
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class GenerationTag(jinja2.ext.Extension):
        """``{% generation %}...{% endgeneration %}`` renders its body (transformers uses it to
        mark assistant tokens; we never ask for that mask)."""
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller):
            return caller()

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        # not jinja's own: that one escapes HTML characters
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(format):
        return datetime.now().strftime(format)

    class TemplateDict:
        def __call__(self, *args, **kwargs):
            return dict(*args, **kwargs)

        def fromkeys(self, *args, **kwargs):
            return dict.fromkeys(*args, **kwargs)

    class TemplateNamespace(jinja2.utils.Namespace):
        def __init__(*args, **kwargs):
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            for name in attrs:
                TemplateNamespace._check_name(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name, value):
            TemplateNamespace._check_name(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check_name(name):
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(
                    f"Chat templates cannot store underscore-prefixed attributes on a namespace, but got {name!r}.")

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationTag, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    env.globals["dict"] = TemplateDict()
    env.globals["namespace"] = TemplateNamespace
    return env.from_string(chat_template)
