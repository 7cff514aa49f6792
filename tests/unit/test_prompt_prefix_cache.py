"""The leading messages every job of a task shares (system prompt, few-shot turns) are rendered
and encoded once per tokenizer: message spans stay what rendering each prefix afresh gives."""
from __future__ import annotations

from prorl_celery.llm.tokenizer import PREFIX_CACHE_SIZE, ChatTokenizer, HFTokenizer

SYSTEM = {"role": "system", "content": "Solve the problem. Put the answer in \\boxed{}."}
SHOT = [{"role": "user", "content": "1 + 1?"}, {"role": "assistant", "content": "\\boxed{2}"}]


def conversations(n: int) -> list[list[dict]]:
    return [[SYSTEM, *SHOT, {"role": "user", "content": f"What is {i} + {i}?"}] for i in range(n)]


def test_shared_leading_messages_are_rendered_once_and_give_the_same_spans(qwen3_tokenizer: str) -> None:
    cached = ChatTokenizer(HFTokenizer(qwen3_tokenizer), name="cached")
    fresh = ChatTokenizer(HFTokenizer(qwen3_tokenizer), name="fresh")
    fresh._prefix_cacheable = False
    renders = 0
    render = cached.render

    def counting(*args, **kwargs):
        nonlocal renders
        renders += 1
        return render(*args, **kwargs)

    cached.render = counting  # type: ignore[method-assign]  # count what the cache saves
    for messages in conversations(5):
        prompt = cached.prompt_ids(messages)
        assert prompt == fresh.prompt_ids(messages)
        assert cached.message_ends(messages, prompt) == fresh.message_ends(messages, prompt)
    # each job renders its whole prompt; the three shared prefixes were rendered once, not five times
    assert renders == 5 + 3
    assert len(cached._prefix_cache) == 3

    for messages in conversations(PREFIX_CACHE_SIZE + 10):  # distinct prefixes: the cache stays bounded
        other = [*messages[1:], SYSTEM]
        cached.message_ends(other, cached.prompt_ids(other))
    assert len(cached._prefix_cache) == PREFIX_CACHE_SIZE
