"""verl's agent loop through the service: a verl data set row run by the ``prorl`` agent loop,
exactly as verl's ``AgentLoopWorker`` runs each row of a batch, against a running ``prorl up``.
verl pins ``transformers<5.11``, so it runs in a venv of its own:

    python=$(scripts/install_verl.sh | tail -n 1)
    $python examples/trainer/verl_agent_loop.py [--gateway http://127.0.0.1:8080]

In a verl training run, the same two things make every rollout a job of the service: import
``prorl_celery.trainer.integrations.verl`` in the trainer (it registers the agent loop), and give
the rows ``agent_name: prorl`` (or set ``actor_rollout_ref.rollout.agent.default_agent_loop=prorl``),
with ``PRORL_GATEWAY_URL`` (or ``prorl.gateway_url`` in the trainer config) naming the gateway.
"""
import argparse
import asyncio
import os
import subprocess

import hydra
from omegaconf import OmegaConf
from transformers import AutoTokenizer
from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap, _agent_loop_registry

import prorl_celery.trainer.integrations.verl  # noqa: F401  (registers the agent loop "prorl")

parser = argparse.ArgumentParser()
parser.add_argument("--gateway", default="http://127.0.0.1:8080")
parser.add_argument("--tokenizer", help="the policy's tokenizer (default: the one prorl up serves with)")
args = parser.parse_args()
os.environ["PRORL_GATEWAY_URL"] = args.gateway
fixtures = subprocess.check_output(["prorl", "fixtures", "path"], text=True).strip()  # built by prorl up
tokenizer_dir = args.tokenizer or f"{fixtures}/tokenizer-qwen3-v1"

# a row as verl's RL data set gives it (a parquet row of verl's math recipes)
row = {"agent_name": "prorl", "data_source": "math",
       "raw_prompt": [{"role": "user", "content": "What is 2 + 3? Put the answer in \\boxed{}."}],
       "reward_model": {"style": "rule", "ground_truth": "5"}, "extra_info": {"index": 0}}
config = OmegaConf.create({"actor_rollout_ref": {"rollout": {"response_length": 256, "prompt_length": 512}},
                           "data": {}})


async def main() -> None:
    # what verl's AgentLoopWorker does for each row of a batch
    loop = hydra.utils.instantiate(config=_agent_loop_registry[row.pop("agent_name")],
                                   trainer_config=DictConfigWrap(config=config), server_manager=None,
                                   tokenizer=AutoTokenizer.from_pretrained(tokenizer_dir), processor=None,
                                   dataset_cls=None, data_config=DictConfigWrap(config.data),
                                   tools=ToolListWrap([]))
    output = await loop.run({"temperature": 1.0, "top_p": 1.0, "top_k": -1, "logprobs": True}, **row)
    print(f"{type(loop).__name__}: {len(output.prompt_ids)} prompt ids, {len(output.response_ids)} response ids, "
          f"{sum(output.response_mask)} of them the model's, reward_score {output.reward_score}, "
          f"{output.num_turns} turns")


asyncio.run(main())
