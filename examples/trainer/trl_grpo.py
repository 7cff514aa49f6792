"""GRPO with TRL whose rollouts run in the service: TRL's ``GRPOTrainer`` with ``ProrlRollout`` as
its ``rollout_func`` and the service's EVAL as its reward, against a running ``prorl up``.

    pip install -e '.[trl]'
    python examples/trainer/trl_grpo.py [--gateway http://127.0.0.1:8080] [--model DIR]

The policy is the tiny model ``prorl up`` serves (``--model``: the same directory), so the two
start equal. This example does not push the trainer's weights back to the LLM server: with a real
vLLM, give ``ProrlRollout`` ``servers=["http://vllm:8000/v1"]`` and ``weights_dir=`` (a directory
the servers can read), and every step's rollouts run on the weights of that step
(docs/trainer.md).
"""
import argparse
import subprocess

import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import GRPOConfig, GRPOTrainer

from prorl_celery.trainer.integrations.trl import ProrlRollout, service_reward

parser = argparse.ArgumentParser()
parser.add_argument("--gateway", default="http://127.0.0.1:8080")
parser.add_argument("--model", help="the policy's directory (default: the tiny model prorl up serves)")
parser.add_argument("--steps", type=int, default=2)
parser.add_argument("--out", default="/tmp/prorl-trl-example")
args = parser.parse_args()
fixtures = subprocess.check_output(["prorl", "fixtures", "path"], text=True).strip()  # built by prorl up
model_dir = args.model or f"{fixtures}/tiny-qwen2-qwen3-v1"

# every row is a job instance (any task family); TRL passes its "prompt" column to the rollout
problems = [(f"What is {a} + {b}?", str(a + b)) for a, b in [(2, 3), (7, 5), (4, 4), (9, 1)]]
dataset = Dataset.from_list([{"prompt": question, "data_source": "math", "problem": question, "answer": answer}
                             for question, answer in problems])

rollout = ProrlRollout(args.gateway, rows=dataset, sampling_params={"temperature": 1.0, "max_tokens": 32})
config = GRPOConfig(output_dir=args.out, max_steps=args.steps, num_generations=4, per_device_train_batch_size=4,
                    max_completion_length=32, learning_rate=1e-5, beta=0.0, logging_steps=1,
                    save_strategy="no", report_to=[], use_cpu=True, bf16=False, disable_tqdm=True)
trainer = GRPOTrainer(model=AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32),
                      processing_class=AutoTokenizer.from_pretrained(model_dir), args=config,
                      train_dataset=dataset, reward_funcs=[service_reward], rollout_func=rollout)
trainer.train()
for step, timing in enumerate(rollout.timings, 1):
    print(f"step {step}: {timing.rollouts} rollouts in {timing.rollout_s:.1f} s, {timing.failed} dropped")
print("mean rewards per step:", [round(h["reward"], 3) for h in trainer.state.log_history if "reward" in h])
