"""A minimal RL training loop on the rollout service, with the DAPO collector.

No deep-learning framework: the "policy" is a scripted LLM server whose answers are right or
wrong per prompt and per sample, and the "update" computes the group-normalised advantages a
GRPO/DAPO trainer would feed its loss. What matters is where things go:

    collector.next_batch()          -> B informative groups; replenishment, early stop, carry-over
    trainer_update(batch)           -> your optimizer step (advantages below)
    clear_llm_server + add_llm_server after the weights changed: new rollouts run on the new
                                       weights and are tagged with a new backend generation

Run it on its own (it starts Redis, the gateway, the workers and a scripted LLM server):

    python examples/train_loop.py --steps 4

or against a running service (``prorl up --llm rules.json`` after ``--write-rules rules.json``,
or your own deployment with a real vLLM server):

    python examples/train_loop.py --gateway http://127.0.0.1:8080 --llm http://127.0.0.1:8000/v1
"""
from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from prorl_celery.trainer.client import RolloutClient
from prorl_celery.trainer.dapo import Batch, DAPOCollector, Group

PROMPTS = 24
#: per prompt: easy (always right), hard (always wrong), medium (right on even samples)
DIFFICULTY = ("easy", "medium", "hard", "medium")


def problems() -> list[dict[str, Any]]:
    """Small arithmetic problems in the math handler's plain shape."""
    return [{"data_source": "math", "instance_id": f"q{i}", "problem": f"[q{i}] What is {i} + {2 * i + 1}?",
             "answer": str(3 * i + 1), "difficulty": DIFFICULTY[i % len(DIFFICULTY)]} for i in range(PROMPTS)]


def scripted_rules() -> list[dict[str, Any]]:
    """Rules for ``prorl_celery.dev.llm_server --scripted``: the reply depends on the prompt and the
    sample mark that :func:`sample_request` adds, so the samples of one prompt can disagree."""
    rules = []
    for p in problems():
        right, wrong = f"The sum is \\boxed{{{p['answer']}}}.", f"The sum is \\boxed{{{int(p['answer']) + 1}}}."
        tag = f"\\[{p['instance_id']}\\]"
        if p["difficulty"] == "medium":
            rules.append({"match": f"{tag}.*\\(sample \\d*[02468]\\)", "replies": [right], "scope": "prompt"})
        reply = right if p["difficulty"] == "easy" else wrong
        rules.append({"match": tag, "replies": [reply], "scope": "prompt"})
    return rules


def sample_request(group: Group, index: int) -> dict[str, Any]:
    """One rollout's request: a real trainer varies the sampling seed; the scripted server needs
    the variation in the prompt text to answer differently."""
    instance = {k: v for k, v in group.instance.items() if k != "difficulty"}
    instance.update(problem=f"{instance['problem']} (sample {index})", trajectory_id=f"{group.prompt_id}-{index}")
    return {"instance": instance, "sampling_params": {"temperature": 1.0, "max_tokens": 64, "seed": index}}


def prompt_stream() -> Iterator[dict[str, Any]]:
    """Epochs over the prompts (a real loader shuffles)."""
    return itertools.chain.from_iterable(itertools.repeat(problems()))


def trainer_update(batch: Batch, generation: int) -> dict[str, float]:
    """Where the optimizer step goes. Here only its inputs: GRPO/DAPO advantages, the token-level
    policy-gradient surrogate ``-A * logprob`` averaged over model tokens, and token counts.

    Samples produced under an older backend generation (carried over across a weight update)
    get half the weight; dropping them is the other common choice. The tokens trained on are those
    of each sample's loss mask (``rollout.samples``): not the observations, nor a fork's shared
    prefix (docs/trainer.md, "Fork groups").
    """
    surrogate, tokens, advantages = 0.0, 0, []
    for group in batch.groups:
        mean, std = statistics.fmean(group.rewards), statistics.pstdev(group.rewards)
        for rollout in group.ordered:
            advantage = (rollout.reward - mean) / (std + 1e-6)
            weight = 1.0 if rollout.generation == generation else 0.5
            for sample in rollout.samples:
                model_logprobs = [lp for lp, m in zip(sample.response_logprobs, sample.response_mask) if m]
                surrogate -= weight * advantage * sum(model_logprobs)
                tokens += len(model_logprobs)
            advantages.append(advantage)
    return {"surrogate_loss": surrogate / max(1, tokens), "tokens": tokens,
            "mean_abs_advantage": statistics.fmean(map(abs, advantages))}


def train(gateway_urls: list[str], llm_address: str, *, steps: int = 4, group_size: int = 4,
          batch_groups: int = 4, update_s: float = 0.2, log=print) -> list[dict[str, Any]]:
    history = []
    with RolloutClient(gateway_urls) as client:
        generation = client.clear_llm_servers()
        client.add_llm_server(llm_address)
        with DAPOCollector(client, prompt_stream(), group_size=group_size, batch_groups=batch_groups,
                           max_in_flight=2 * group_size * batch_groups, make_request=sample_request) as collector:
            for _ in range(steps):
                batch = collector.next_batch()
                update = trainer_update(batch, generation)
                time.sleep(update_s)  # the optimizer step; rollouts carried over keep running meanwhile
                # new weights: the inference server reloads them (vLLM: sleep/wake or a weight sync),
                # then the service is told, so new rollouts carry the new generation
                generation = client.clear_llm_servers()
                client.add_llm_server(llm_address)
                stale = sum(1 for r in batch.rollouts if r.carried_over)
                record = {"step": batch.step, "generation": generation, "stale_rollouts": stale,
                          **batch.stats.as_dict(), **update}
                history.append(record)
                log(" ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in record.items()
                             if v is not None))
    return history


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gateway", action="append", help="gateway URL (repeat for several); default: start one")
    parser.add_argument("--llm", help="LLM server address to register (default: the scripted one started here)")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--batch-groups", type=int, default=4)
    parser.add_argument("--write-rules", metavar="FILE", help="write the scripted server's rules and exit")
    args = parser.parse_args(argv)
    if args.write_rules:
        Path(args.write_rules).write_text(json.dumps(scripted_rules(), indent=1))
        return 0
    options = dict(steps=args.steps, group_size=args.group_size, batch_groups=args.batch_groups)
    if args.gateway:
        if not args.llm:
            parser.error("--llm is required with --gateway")
        train(args.gateway, args.llm, **options)
        return 0
    from prorl_celery.dev.devmodels import ensure_tokenizer
    from prorl_celery.dev.local import LocalCluster

    tokenizer = str(ensure_tokenizer("qwen3"))
    rules = Path(tempfile.mkstemp(prefix="train-loop-rules-", suffix=".json")[1])
    rules.write_text(json.dumps(scripted_rules()))
    command = [sys.executable, "-m", "prorl_celery.dev.llm_server", "--scripted", str(rules), "--tokenizer", tokenizer,
               "--port", "{port}"]
    with LocalCluster(llm_command=command, tokenizer=tokenizer) as cluster:
        print(f"service at {cluster.gateway_url}, scripted LLM at {cluster.llm_url}, logs in {cluster.log_dir}")
        train([cluster.gateway_url], args.llm or cluster.llm_url, **options)
    return 0


if __name__ == "__main__":
    sys.exit(main())
