"""Token fidelity: the token path (the service's ids, as TRL trains on them) against a trainer's
own recompute, and against the text path (re-render the messages with the chat template and
re-tokenize, as a trainer does that receives text).

    python bench/fidelity.py        # reads bench/results/grpo_trl_cpu_rollouts.jsonl (the RL run's rollouts)

Per rollout of the RL run (examples/grpo_trl_cpu.py: real vLLM CPU float32, the weights each
rollout ran on kept on disk):
- token path: per model token, |rollout logprob - transformers float32 recompute over the same
  ids with the same weights|;
- text path, Qwen3 (the template the run used): re-render ``messages`` with the tools, re-tokenize,
  align with the token path (difflib on ids): trajectories that differ, tokens of the token path
  that the text path does not have, and the importance ratio exp(logp_text - logp_rollout) a
  trainer on the text path computes: per aligned model token (same token, other context) and per
  trajectory (sum over the model tokens of each path; the text path's own tokens where they
  differ);
- text path, Llama 3 and Qwen3 built by the service's session code from the same conversations
  (no Llama 3 model was sampled: only what the template's re-rendering changes, not what
  non-canonical sampled tokenizations change).
Writes bench/results/fidelity.json and .png.
"""
from __future__ import annotations

import argparse
import difflib
import json
import math
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# the text path is built by the code a text-path training run uses (examples/grpo_trl_cpu.py --path text)
from prorl_celery.trainer.integrations.trl import (  # noqa: E402
    align,
    cut_after_last_eot,
    plain_messages,
    retokenize,
)


def tool_schemas() -> list[dict]:
    """The schemas of the math task's python tool, as the service's agent loop renders them."""
    from handlers.agent import AgentLoop
    from handlers.sandbox_tools import PYTHON

    return AgentLoop(tools=[PYTHON], finish_tool=False).tool_schemas()


def logprobs_of(model, ids: list[int]):
    import torch

    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0].float()
    lp = torch.log_softmax(logits, -1)
    return [0.0] + [float(lp[i - 1, ids[i]]) for i in range(1, len(ids))]


def quantiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    ordered = sorted(values)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
    return {"n": len(values), "mean": statistics.fmean(values), "p50": pick(0.5), "p99": pick(0.99),
            "max": ordered[-1], "min": ordered[0]}


def service_built(chat, messages: list[dict[str, Any]], tools: list[dict]) -> tuple[list[int], list[int]]:
    """Ids and mask as the service's session builds them: the prompt rendered once, each
    assistant turn encoded once and closed with the end-of-turn token, each observation appended."""
    first = next(i for i, m in enumerate(messages) if m["role"] == "assistant")
    ids = chat.prompt_ids(messages[:first], tools)
    mask = [0] * len(ids)
    for message in messages[first:]:
        if message["role"] == "assistant":
            part, role = chat.encode(message["content"]) + [chat.eot_id], 1
        else:
            part, role = chat.observation_ids(message, tools), 0
        ids += part
        mask += [role] * len(part)
    return ids, mask


def template_drift(chat, conversations: list[list[dict]], tools: list[dict]) -> dict[str, Any]:
    differ, tokens, changed, model_tokens, model_changed, extra = 0, 0, 0, 0, 0, 0
    for messages in conversations:
        ids, mask = service_built(chat, messages, tools)
        text = cut_after_last_eot(chat.encode(chat.render(messages, tools)), chat.eot_id)
        differ += ids != text
        matched = sum(b.size for b in difflib.SequenceMatcher(a=ids, b=text, autojunk=False).get_matching_blocks())
        text_mask, mapping = align(ids, mask, text)
        kept = {a for a in mapping if a is not None}
        extra += sum(1 for a in mapping if a is None)
        tokens += len(ids)
        changed += len(ids) - matched
        model_tokens += sum(mask)
        model_changed += sum(1 for k, m in enumerate(mask) if m and k not in kept)
    return {"trajectories": len(conversations), "trajectories_differ": differ / max(1, len(conversations)),
            "tokens": tokens, "tokens_differ": changed / max(1, tokens), "model_tokens": model_tokens,
            "model_tokens_differ": model_changed / max(1, model_tokens),
            "text_tokens_not_in_token_path_per_trajectory": extra / max(1, len(conversations))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rollouts", type=Path, default=ROOT / "bench" / "results" / "grpo_trl_cpu_rollouts.jsonl")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "fidelity")
    parser.add_argument("--limit", type=int, default=0, help="at most this many rollouts (0: all)")
    args = parser.parse_args(argv)
    import torch
    from transformers import AutoModelForCausalLM

    from prorl_celery.dev.devmodels import ensure_tokenizer
    from prorl_celery.llm.tokenizer import load_tokenizer

    torch.set_num_threads(max(1, torch.get_num_threads()))
    rollouts = [json.loads(line) for line in args.rollouts.read_text().splitlines() if line.strip()]
    rollouts = [r for r in rollouts if r["status"] == "completed" and r.get("response_ids")]
    if args.limit:
        rollouts = rollouts[:args.limit]
    tools = tool_schemas()
    qwen3 = load_tokenizer(str(ensure_tokenizer("qwen3")))
    llama3 = load_tokenizer(str(ensure_tokenizer("llama3")))
    by_weights: dict[str, list[dict]] = defaultdict(list)
    for r in rollouts:
        by_weights[r["weights"]].append(r)
    token_deltas: list[float] = []
    worst_per_rollout: list[float] = []
    text_ratio_tokens: list[float] = []
    text_ratio_seq: list[float] = []
    differ = changed = total = model_total = model_changed = extra = extra_model = 0
    examples: list[dict[str, Any]] = []
    for weights, group in by_weights.items():
        model = AutoModelForCausalLM.from_pretrained(weights, dtype=torch.float32).eval()
        for r in group:
            ids = r["prompt_ids"] + r["response_ids"]
            offset = len(r["prompt_ids"])
            mask = [0] * offset + r["response_mask"]
            rollout_lp = [0.0] * offset + r["response_logprobs"]
            recomputed = logprobs_of(model, ids)
            deltas = [abs(recomputed[k] - rollout_lp[k]) for k in range(offset, len(ids)) if mask[k]]
            token_deltas += deltas
            worst_per_rollout.append(max(deltas))
            # the text path
            path = retokenize(qwen3, r["messages"], tools, ids, mask)
            text, text_mask, mapping = path.ids, path.mask, path.mapping
            differ += text != ids
            kept = {a for a in mapping if a is not None}
            total += len(ids)
            changed += len(ids) - len(kept)
            model_total += sum(mask)
            model_changed += sum(1 for k in range(len(ids)) if mask[k] and k not in kept)
            extra += sum(1 for a in mapping if a is None)
            extra_model += sum(1 for j, a in enumerate(mapping) if a is None and text_mask[j])
            text_lp = logprobs_of(model, text) if text != ids else recomputed
            for j, a in enumerate(mapping):
                if a is not None and mask[a] and text_mask[j]:
                    text_ratio_tokens.append(math.exp(text_lp[j] - rollout_lp[a]))
            seq_delta = sum(text_lp[j] for j in range(len(text)) if text_mask[j]) - \
                sum(rollout_lp[k] for k in range(len(ids)) if mask[k])
            text_ratio_seq.append(seq_delta)  # the log of the trajectory's ratio
            if text != ids and len(examples) < 3:
                ops = [op for op in difflib.SequenceMatcher(a=ids, b=text, autojunk=False).get_opcodes()
                       if op[0] != "equal"][:3]
                examples.append({"ops": [(op, qwen3.hf.decode(ids[a0:a1]), qwen3.hf.decode(text[b0:b1]))
                                         for op, a0, a1, b0, b1 in ops]})
    conversations = [plain_messages(r["messages"]) for r in rollouts]
    within = lambda xs, lo, hi: sum(lo <= x <= hi for x in xs) / max(1, len(xs))  # noqa: E731
    report = {
        "command": "python bench/fidelity.py " + " ".join(argv or sys.argv[1:]),
        "rollouts": len(rollouts), "weights": len(by_weights),
        "token_path": {"abs_delta_logprob": quantiles(token_deltas),
                       "worst_per_rollout": quantiles(worst_per_rollout),
                       "tokens_over_1e-3": sum(d > 1e-3 for d in token_deltas)},
        "text_path_qwen3_sampled": {
            "trajectories_differ": differ / max(1, len(rollouts)), "tokens": total,
            "tokens_differ": changed / max(1, total), "model_tokens": model_total,
            "model_tokens_differ": model_changed / max(1, model_total),
            "text_tokens_not_in_token_path_per_trajectory": extra / max(1, len(rollouts)),
            "of_which_in_model_turns_per_trajectory": extra_model / max(1, len(rollouts)),
            "ratio_per_aligned_model_token": quantiles(text_ratio_tokens),
            "ratio_per_aligned_token_outside_0.8_1.25": 1 - within(text_ratio_tokens, 0.8, 1.25),
            "log_ratio_per_trajectory": quantiles(text_ratio_seq),
            "ratio_per_trajectory_outside_0.8_1.25": 1 - within(text_ratio_seq, math.log(0.8), math.log(1.25)),
            "examples": examples},
        "template_only": {"qwen3": template_drift(qwen3, conversations, tools),
                          "llama3": template_drift(llama3, conversations, tools)},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(report, indent=2))
    plot(report, token_deltas, text_ratio_tokens, text_ratio_seq, args.out.with_suffix(".png"))
    print(json.dumps({k: v for k, v in report.items() if k != "text_path_qwen3_sampled"}, indent=1))
    print(json.dumps({k: v for k, v in report["text_path_qwen3_sampled"].items() if k != "examples"}, indent=1))
    return 0


def plot(report, token_deltas, ratio_tokens, ratio_seq, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    axes[0].hist([max(d, 1e-9) for d in token_deltas], bins=[10 ** (x / 4) for x in range(-36, 1)], color="C0")
    axes[0].set_xscale("log")
    axes[0].set(title=f"token path: |Δ logprob| vs trainer recompute\n{len(token_deltas)} model tokens, vLLM CPU fp32",
                xlabel="|Δ logprob|", ylabel="tokens")
    logs = [math.log(max(r, 1e-12)) for r in ratio_tokens]
    axes[1].hist(logs, bins=60, color="C1")
    axes[1].set_yscale("log")
    axes[1].set(title="text path (Qwen3): log importance ratio\nper aligned model token", xlabel="log exp(Δ) = Δ",
                ylabel="tokens")
    axes[2].hist(ratio_seq, bins=60, color="C2")
    axes[2].set(title="text path (Qwen3): log ratio per trajectory", xlabel="Σ Δ over model tokens", ylabel="rollouts")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
