"""GRPO through the rollout service on CPU: TRL trains, the service rolls out, vLLM generates.

    python examples/grpo_trl_cpu.py                       # 3 seeds, ~25 min on 2 cores
    python examples/grpo_trl_cpu.py --seeds 0 --steps 8   # a quick look
    python examples/grpo_trl_cpu.py --seeds 0 --path token text --seeded-sampling \
        --out bench/results/grpo_trl_paths                  # the token path against the text path

What runs:
1. a warm start: the tiny Qwen2 with the real Qwen3 tokenizer (``devmodels.ensure_vllm_model``,
   which knows the tool-call format on seven problems) is fine-tuned briefly on synthetic
   arithmetic problems this script builds (``python`` tool call, the tool's output, a ``\\boxed{}``
   answer), so the policy starts with some reward, not none;
2. a local service (Redis, gateway, INIT/RUN/EVAL Celery pools; the python tool runs in the
   sandbox) and a real vLLM (CPU build, float32) on the warm-started weights;
3. per seed: held-out accuracy (greedy, through the service), then TRL's ``GRPOTrainer`` with
   ``prorl_celery.trainer.integrations.trl.ProrlRollout`` as its ``rollout_func``: every rollout is a
   multi-turn math job through the gateway, the reward is the service's EVAL
   (``service_reward``), and the trainer's weights are pushed to vLLM before every step
   (``VLLMWeightSync``: pause keep, reload, version, resume); then held-out accuracy again, and
   vLLM back on the warm start for the next seed.

Paths (``--path``): ``token`` trains on the service's ids, logprobs and mask as they are;
``text`` trains on what a trainer that receives text builds (``ProrlRollout(path="text")``: each
rollout's messages re-rendered with the Qwen3 chat template and re-tokenized, the mask the
template's assistant turns, no rollout logprobs). With several paths every seed runs once per
path from the same warm start; ``--seeded-sampling`` gives every rollout a sampler seed from
(seed, step, row), so both paths sample the same first step and differ only by what they train on.

Writes ``bench/results/grpo_trl_cpu.json`` and ``.png`` (reward per step per seed, time per step
split into rollout / weight sync / training, rollouts per step, held-out accuracy before/after).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

INSTANCE = {"data_source": "math", "tools": ["python"], "max_iterations": 3}


def make_problems(n: int, seed: int) -> list[tuple[str, str, str, str]]:
    """``(problem, answer, code, boxed)``: ``a * b + c`` with one-digit numbers (448 distinct)."""
    rng = random.Random(seed)
    out, seen = [], set()
    while len(out) < n:
        a, b, c = rng.randint(2, 9), rng.randint(2, 9), rng.randint(1, 7)
        if (a, b, c) in seen:
            continue
        seen.add((a, b, c))
        value = str(a * b + c)
        out.append((f"Compute {a} * {b} + {c}.", value, f"print({a} * {b} + {c})", value))
    return out


def rows_of(problems) -> list[dict[str, Any]]:
    """Data set rows: TRL's ``prompt`` column plus the job instance fields."""
    return [{"prompt": p, "problem": p, "answer": a, **INSTANCE} for p, a, _, _ in problems]


# ----------------------------------------------------------------------------- warm start


def warm_start(out: Path, problems, steps: int, lr: float, log) -> dict[str, Any]:
    """A short SFT of the tiny tool-using model on ``problems`` (the masked model tokens of the
    exact sequences the math agent loop builds), with a sampled softmax like devmodels'."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from prorl_celery.dev.devmodels import ensure_tokenizer, ensure_vllm_model, sft_batch, sft_sequences

    base = ensure_vllm_model("qwen3")
    tok = AutoTokenizer.from_pretrained(base)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    inputs, attention, labels = sft_batch(sft_sequences(ensure_tokenizer("qwen3"), problems), tok.pad_token_id)
    chosen = labels != -100
    vocab = model.config.vocab_size
    used = torch.unique(inputs[attention.bool()])
    weight = model.model.embed_tokens.weight
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    noise = torch.Generator().manual_seed(0)
    started = time.monotonic()
    batch = torch.Generator().manual_seed(1)
    for _ in range(steps):
        pick = torch.randperm(len(inputs), generator=batch)[:16]
        sub_chosen = chosen[pick]
        candidates = torch.unique(torch.cat([used, torch.randint(0, vocab, (8192,), generator=noise)]))
        index = torch.full((vocab,), -1)
        index[candidates] = torch.arange(len(candidates))
        hidden = model.model(input_ids=inputs[pick], attention_mask=attention[pick]).last_hidden_state[sub_chosen]
        loss = torch.nn.functional.cross_entropy(hidden @ weight[candidates].T, index[labels[pick][sub_chosen]])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    log(f"warm start: {steps} SFT steps on {len(problems)} problems in {time.monotonic() - started:.0f} s "
        f"(last loss {loss.item():.3f})")
    return {"steps": steps, "problems": len(problems), "lr": lr, "seconds": time.monotonic() - started,
            "last_loss": loss.item()}


# ----------------------------------------------------------------------------- service side


def held_out_accuracy(gateway_url: str, rows, max_tokens: int) -> float:
    """Greedy rollouts of the held-out rows through the service: the mean reward."""
    from prorl_celery.trainer.client import JobRequest, RolloutClient

    with RolloutClient(gateway_url) as client:
        ids = client.submit_many([JobRequest({k: v for k, v in r.items() if k != "prompt"},
                                             {"temperature": 0.0, "max_tokens": max_tokens}) for r in rows])
        results = client.wait_all(ids, 1800)
    return statistics.fmean(float(r.get("reward") or 0.0) for r in results)


def score_only_completions_on_cpu() -> None:
    """TRL 1.16 scores every position of each sequence (prompt included) through its chunked LM
    head on devices without Triton, and only the completion positions with Triton; on this CPU
    that is 3-4x the work and ~100 s per step. Take the compact path (the same torch kernels,
    the completion positions only)."""
    import trl.trainer.utils as trl_utils

    trl_utils._use_triton = lambda device: True  # only the "compact" choice reads this name


def train_seed(seed: int, path: str, args, gateway_url: str, vllm_address: str, warm_dir: Path, train_rows,
               test_rows, work: Path, log, dump: list[dict[str, Any]]) -> dict[str, Any]:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from prorl_celery.dev.devmodels import ensure_tokenizer
    from prorl_celery.llm.tokenizer import load_tokenizer
    from prorl_celery.trainer.integrations.trl import ProrlRollout, service_reward
    from prorl_celery.trainer.weights import VLLMWeightSync

    score_only_completions_on_cpu()
    before = held_out_accuracy(gateway_url, test_rows, args.max_tokens)
    name = f"seed{seed}" if path == "token" else f"seed{seed}-{path}"
    log(f"seed {seed}, {path} path: held-out accuracy before {before:.3f}")
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(warm_dir, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(warm_dir)
    by_prompt = {r["prompt"]: {k: v for k, v in r.items() if k != "prompt"} for r in train_rows}
    rollout = ProrlRollout(gateway_url, instance_for=by_prompt.__getitem__, servers=[vllm_address],
                           weights_dir=work / name, keep_weights=10_000,
                           sampling_params={"temperature": 1.0, "max_tokens": args.max_tokens},
                           path=path, text_tokenizer=load_tokenizer(str(ensure_tokenizer("qwen3"))),
                           seed=seed if args.seeded_sampling else None)
    train_times: list[float] = []

    class Clock(TrainerCallback):
        """Training time of a step = the step's wall time minus its rollout and weight sync."""

        def on_step_begin(self, *_, **__):
            self.started = time.monotonic()

        def on_step_end(self, *_, **__):
            timing = rollout.timings[-1]
            train_times.append(time.monotonic() - self.started - timing.rollout_s - timing.weight_sync_s)
            weights = warm_dir if timing.policy_version == 0 else work / name / f"step-{timing.policy_version}"
            for result in rollout.results:  # for bench/fidelity.py: the weights each rollout ran on
                t = result.get("trajectory") or {}
                dump.append({"seed": seed, "path": path, "step": len(train_times),
                             "policy_version": timing.policy_version,
                             "weights": str(weights), "status": result.get("status"), "reward": result.get("reward"),
                             "messages": result.get("messages"), "tools": ["python"],
                             **{k: t.get(k) for k in ("prompt_ids", "response_ids", "response_mask",
                                                      "response_logprobs", "policy_versions")}})

    config = GRPOConfig(
        output_dir=str(work / f"trl-{name}"), seed=seed, max_steps=args.steps, learning_rate=args.lr,
        per_device_train_batch_size=args.prompts * args.generations // 2, gradient_accumulation_steps=2,
        num_generations=args.generations, max_completion_length=args.max_tokens, temperature=1.0, beta=0.0,
        logging_steps=1, save_strategy="no", report_to=[], use_cpu=True, bf16=False,
        dataloader_num_workers=0, shuffle_dataset=True, disable_tqdm=True)
    trainer = GRPOTrainer(model=model, processing_class=tokenizer, args=config,
                          train_dataset=Dataset.from_list(train_rows), reward_funcs=[service_reward],
                          rollout_func=rollout, callbacks=[Clock()])
    started = time.monotonic()
    trainer.train()
    wall = time.monotonic() - started
    logged = [h for h in trainer.state.log_history if "reward" in h]
    rewards = [h["reward"] for h in logged]
    # the rollouts of the last step ran on the weights before its update: push the final ones
    final = work / name / "final"
    trainer.model.save_pretrained(final, safe_serialization=True)
    with VLLMWeightSync(gateway_url) as sync:
        sync.update([vllm_address], str(final), version=args.steps + 1)
        after = held_out_accuracy(gateway_url, test_rows, args.max_tokens)
        sync.update([vllm_address], str(warm_dir), version=0)  # the next seed starts from the warm start
    rollout.close()
    log(f"seed {seed}, {path} path: reward per step {[round(r, 2) for r in rewards]}; held-out {before:.3f} -> "
        f"{after:.3f} ({wall:.0f} s)")
    steps = []
    for i, timing in enumerate(rollout.timings):
        steps.append({"step": i + 1, "reward": rewards[i] if i < len(rewards) else None,
                      "rollouts": timing.rollouts, "failed": timing.failed, "policy_version": timing.policy_version,
                      "rollout_s": timing.rollout_s, "weight_sync_s": timing.weight_sync_s,
                      "train_s": train_times[i] if i < len(train_times) else None,
                      # TRL's own: the share of model tokens its PPO clip cut, of rollouts that end cut
                      # off (no end-of-turn last; trained as they are: mask_truncated_completions is off),
                      # model tokens per rollout
                      **{key: logged[i].get(trl_key) if i < len(logged) else None
                         for key, trl_key in (("clip_ratio", "clip_ratio/region_mean"),
                                              ("truncated_ratio", "completions/clipped_ratio"),
                                              ("model_tokens_per_rollout", "completions/mean_length"))},
                      **({"text_drift": rollout.path_stats[i]} if i < len(rollout.path_stats) else {})})
    return {"seed": seed, "path": path, "held_out_before": before, "held_out_after": after, "wall_s": wall,
            "steps": steps}


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    paths = list(report["by_path"])

    def run_label(run: dict[str, Any]) -> str:
        return f"seed {run['seed']}" + (f", {run['path']} path" if len(paths) > 1 else "")

    for run in report["runs"]:
        xs = [s["step"] for s in run["steps"]]
        style = {"color": f"C{paths.index(run['path'])}", "alpha": 0.6} if len(paths) > 1 else {}
        axes[0].plot(xs, [s["reward"] for s in run["steps"]], marker="o", label=run_label(run), **style)
    for k, name in enumerate(paths):
        mean = report["by_path"][name]["mean_reward_per_step"]
        axes[0].plot(range(1, len(mean) + 1), mean, color="black" if len(paths) == 1 else f"C{k}", linewidth=3,
                     label="mean" if len(paths) == 1 else f"mean, {name} path")
    axes[0].set(xlabel="GRPO step", ylabel="mean reward of the step's rollouts", title="reward per step")
    axes[0].legend()
    run = report["runs"][0]
    xs = [s["step"] for s in run["steps"]]
    bottom = [0.0] * len(xs)
    for key, label in (("rollout_s", "rollout"), ("weight_sync_s", "weight sync"), ("train_s", "training")):
        values = [s[key] or 0.0 for s in run["steps"]]
        axes[1].bar(xs, values, bottom=bottom, label=label)
        bottom = [b + v for b, v in zip(bottom, values)]
    axes[1].set(xlabel="GRPO step", ylabel="seconds", title=f"time per step (seed {run['seed']})")
    axes[1].legend()
    seeds = [run_label(r).replace(", ", "\n") for r in report["runs"]]
    width = 0.35
    axes[2].bar([i - width / 2 for i in range(len(seeds))], [r["held_out_before"] for r in report["runs"]], width,
                label="before")
    axes[2].bar([i + width / 2 for i in range(len(seeds))], [r["held_out_after"] for r in report["runs"]], width,
                label="after")
    axes[2].set_xticks(range(len(seeds)), seeds)
    axes[2].set(ylabel="greedy accuracy", title=f"held-out ({report['held_out_problems']} problems)", ylim=(0, 1))
    axes[2].legend()
    title = f"GRPO through prorl-celery on CPU: TRL + real vLLM, {report['rollouts_per_step']} multi-turn " \
            f"tool rollouts per step, lr {report['args']['lr']:g}"
    if len(paths) > 1:
        title += f"; paths: {', '.join(paths)} (same seed, same warm start)"
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--prompts", type=int, default=4, help="prompts per step")
    parser.add_argument("--generations", type=int, default=4, help="rollouts per prompt (the GRPO group)")
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--path", nargs="+", choices=["token", "text"], default=["token"],
                        help="what TRL trains on: the service's ids (token) or the re-tokenized messages (text); "
                             "several: every seed once per path")
    parser.add_argument("--seeded-sampling", action="store_true",
                        help="a sampler seed per rollout from (seed, step, row): the same seed samples the same")
    parser.add_argument("--max-tokens", type=int, default=96, help="tokens per model turn")
    parser.add_argument("--train-problems", type=int, default=64)
    parser.add_argument("--test-problems", type=int, default=32)
    parser.add_argument("--sft-problems", type=int, default=256)
    parser.add_argument("--sft-steps", type=int, default=140,
                        help="SFT steps of the warm start (here: 100 -> no held-out problem solved, 160 -> 30 of 32)")
    parser.add_argument("--sft-lr", type=float, default=3e-3)
    parser.add_argument("--warm-from", type=Path, help="reuse a warm-started model directory (skips the SFT)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "grpo_trl_cpu")
    args = parser.parse_args(argv)
    log = lambda line: print(f"[grpo] {line}", flush=True)  # noqa: E731
    import signal
    # a SIGTERM (timeout, kill) unwinds like Ctrl-C, so the local service and vLLM are stopped
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    from prorl_celery.core.status import Stage
    from prorl_celery.dev.devmodels import ensure_tokenizer
    from prorl_celery.dev.local import LocalCluster
    from prorl_celery.dev.vllmcpu import find_vllm_python, vllm_launch_command

    python, why = find_vllm_python()
    if python is None:
        print(why, file=sys.stderr)
        return 2
    problems = make_problems(args.train_problems + args.test_problems + args.sft_problems, seed=1234)
    train = problems[:args.train_problems]
    test = problems[args.train_problems:args.train_problems + args.test_problems]
    sft = problems[args.train_problems + args.test_problems:]
    work = Path(tempfile.mkdtemp(prefix="prorl-grpo-"))
    warm_dir = work / "warm"
    report: dict[str, Any] = {"command": "python examples/grpo_trl_cpu.py " + " ".join(argv or sys.argv[1:]),
                              "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
                              "rollouts_per_step": args.prompts * args.generations,
                              "held_out_problems": len(test)}
    if args.warm_from:  # a warm start this script made before (same problems and SFT settings)
        warm_dir = args.warm_from
        report["warm_start"] = {"reused": str(warm_dir), "steps": args.sft_steps, "problems": len(sft)}
    else:
        report["warm_start"] = warm_start(warm_dir, sft, args.sft_steps, args.sft_lr, log)
    cores = sorted(os.sched_getaffinity(0))
    command = vllm_launch_command(python, str(warm_dir), "{port}", max_model_len=2048, cpus=str(cores[-1]))
    started = time.monotonic()
    with LocalCluster(llm_command=command, tokenizer=str(ensure_tokenizer("qwen3")), log_dir=work / "logs",
                      concurrency={Stage.INIT: 4, Stage.RUN: 16, Stage.EVAL: 4}, gateway_workers=1) as cluster:
        log(f"service and vLLM up in {time.monotonic() - started:.0f} s (logs {work / 'logs'})")
        import httpx
        httpx.post(cluster.gateway_url + "/add_llm_server", json={"address": cluster.llm_url, "type": "vllm",
                                                                  "version": 0}, timeout=30).raise_for_status()
        # the trainer on one core with one thread, vLLM on the other: OpenMP threads sharing a
        # core with vLLM's busy-polling engine slow the training step several-fold
        import torch
        cores = sorted(os.sched_getaffinity(0))
        if len(cores) > 1:
            os.sched_setaffinity(0, {cores[0]})
        torch.set_num_threads(1)
        dump: list[dict[str, Any]] = []
        report["runs"] = [train_seed(seed, path, args, cluster.gateway_url, cluster.llm_url, warm_dir,
                                     rows_of(train), rows_of(test), work, log, dump)
                          for seed in args.seeds for path in args.path]
    rollouts_path = args.out.parent / (args.out.name + "_rollouts.jsonl")
    rollouts_path.parent.mkdir(parents=True, exist_ok=True)
    rollouts_path.write_text("".join(json.dumps(r) + "\n" for r in dump))
    report["rollouts_file"] = str(rollouts_path)
    report["weights_kept_in"] = str(work)
    report["by_path"] = {path: summary([r for r in report["runs"] if r["path"] == path]) for path in args.path}
    report.update(report["by_path"][args.path[0]])  # the first path's summary at the top, as with one path
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(report, indent=2))
    plot(report, args.out.with_suffix(".png"))
    for path, s in report["by_path"].items():
        log(f"{path} path: mean reward per step {[round(x, 3) for x in s['mean_reward_per_step']]}")
        log(f"{path} path: reward first third {s['reward_first_third']:.3f} -> last third "
            f"{s['reward_last_third']:.3f} ({s['reward_rise']:+.3f}); held-out {s['held_out_before_mean']:.3f} -> "
            f"{s['held_out_after_mean']:.3f}")
    log(f"wrote {args.out.with_suffix('.json')} and .png")
    return 0


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Reward per step (mean over the runs), first third against last third, held-out, time split."""
    per_step = list(zip(*[[s["reward"] for s in r["steps"]] for r in runs]))
    third = max(1, len(per_step) // 3)
    out: dict[str, Any] = {"mean_reward_per_step": [statistics.fmean(x) for x in per_step],
                           "reward_first_third": statistics.fmean(x for step in per_step[:third] for x in step),
                           "reward_last_third": statistics.fmean(x for step in per_step[-third:] for x in step)}
    out["reward_rise"] = out["reward_last_third"] - out["reward_first_third"]
    out["held_out_before_mean"] = statistics.fmean(r["held_out_before"] for r in runs)
    out["held_out_after_mean"] = statistics.fmean(r["held_out_after"] for r in runs)
    out["time_split_mean_s"] = {k: statistics.fmean(s[k] or 0.0 for r in runs for s in r["steps"])
                                for k in ("rollout_s", "weight_sync_s", "train_s")}
    return out


if __name__ == "__main__":
    sys.exit(main())
