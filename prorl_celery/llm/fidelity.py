"""Would re-rendering a trajectory's messages as text reproduce its token ids?

Token-in/token-out makes this question moot for training (the ids are kept as produced); the
check measures how much a text-based pipeline would have drifted, and finds template bugs.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from prorl_celery.llm.tokenizer import ChatTokenizer


@dataclass(frozen=True)
class FidelityReport:
    match: bool
    length: int  # ids in the trajectory (prompt + response)
    retokenized_length: int
    first_divergence: int | None  # index into prompt + response ids
    expected: list[int]  # a few ids from the trajectory at the divergence
    got: list[int]  # the re-tokenized ids there

    def describe(self, tokenizer: ChatTokenizer) -> str:
        if self.match:
            return f"match: {self.length} ids reproduced"
        return (f"drift at id {self.first_divergence} of {self.length}: trajectory has "
                f"{tokenizer.decode(self.expected, False)!r}, re-tokenized text gives "
                f"{tokenizer.decode(self.got, False)!r}")


def check_trajectory(tokenizer: ChatTokenizer, trajectory: dict[str, Any], window: int = 8) -> FidelityReport:
    ids = list(trajectory["prompt_ids"]) + list(trajectory["response_ids"])
    text = tokenizer.render(trajectory["messages"], trajectory.get("tools"))
    again = tokenizer.encode(text)
    # the template may close the last turn with more than the model produced (Qwen: "\n")
    compared = min(len(ids), len(again))
    divergence = next((i for i in range(compared) if ids[i] != again[i]), None)
    if divergence is None and len(again) < len(ids):
        divergence = len(again)
    if divergence is None:
        return FidelityReport(True, len(ids), len(again), None, [], [])
    return FidelityReport(False, len(ids), len(again), divergence,
                          ids[divergence:divergence + window], again[divergence:divergence + window])
