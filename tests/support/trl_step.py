"""One GRPO step of TRL's own ``GRPOTrainer`` (the tiny model on CPU, no vLLM) whose rollout_func is
``ProrlRollout``: one rollout of ``instance`` fills the group's rows with its samples."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class GrpoStep:
    out: dict[str, Any]  # what TRL's _generate got back from its rollout_func
    result: dict[str, Any]  # the one rollout's result
    logged: dict[str, Any]  # the step's entry of TRL's log history
    timing: Any  # ProrlRollout's StepTiming of the step


def grpo_step_on_samples(gateway_url: str, instance: dict[str, Any], out_dir: Path, *, prompt: str,
                         max_completion_length: int, **rollout_options: Any) -> GrpoStep:
    """Train one step; what TRL received and logged, and the rollout's result."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from prorl_celery.dev.devmodels import ensure_tiny_model
    from prorl_celery.trainer.integrations.trl import ProrlRollout, service_reward

    model_dir = ensure_tiny_model("qwen3")
    rollout = ProrlRollout(gateway_url, instance_for=lambda _: dict(instance), samples_per_rollout=2,
                           **rollout_options)
    received: list[dict[str, Any]] = []

    def rollout_func(prompts, trainer):
        out = rollout(prompts, trainer)
        received.append(out)
        return out

    torch.manual_seed(0)
    config = GRPOConfig(output_dir=str(out_dir), max_steps=1, learning_rate=1e-3,
                        per_device_train_batch_size=2, num_generations=2,
                        max_completion_length=max_completion_length, beta=0.0, logging_steps=1,
                        save_strategy="no", report_to=[], use_cpu=True, bf16=False, disable_tqdm=True, seed=0)
    trainer = GRPOTrainer(model=AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32),
                          processing_class=AutoTokenizer.from_pretrained(model_dir), args=config,
                          train_dataset=Dataset.from_list([{"prompt": prompt}]),
                          reward_funcs=[service_reward], rollout_func=rollout_func)
    try:
        trainer.train()
    finally:
        rollout.close()
    [out] = received
    [result] = rollout.results  # one rollout filled the group's two rows
    [logged] = [entry for entry in trainer.state.log_history if "reward" in entry]
    return GrpoStep(out, result, logged, rollout.timings[0])
