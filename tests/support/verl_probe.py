"""Run in the verl venv (scripts/install_verl.sh) by tests/integration/test_vllm_real.py: verl's own agent
loop machinery instantiates the ``prorl`` agent loop and runs rows through the real service.

    PRORL_GATEWAY_URL=... python tests/support/verl_probe.py TOKENIZER_DIR ROWS.json

Prints one JSON object: the outputs (AgentLoopOutput fields, and ``as_dict`` shapes).
"""
from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

# run as a script, its own directory comes first on sys.path, where tests/support/handlers.py
# would shadow the project's handlers package
if sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
    sys.path.pop(0)


async def main(tokenizer_dir: str, rows_path: str) -> dict:
    import hydra
    import verl
    from omegaconf import OmegaConf
    from transformers import AutoTokenizer
    from verl.experimental.agent_loop.agent_loop import (
        AgentLoopOutput,
        DictConfigWrap,
        ToolListWrap,
        _agent_loop_registry,
    )

    import prorl_celery.trainer.integrations.verl as adapter  # registers "prorl"

    config = OmegaConf.create({"actor_rollout_ref": {"rollout": {"response_length": 512, "prompt_length": 1024}},
                               "data": {}})
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    rows = json.loads(open(rows_path).read())
    outputs = []
    for row in rows:
        # what verl's AgentLoopWorker._run_agent_loop does for each row
        loop = hydra.utils.instantiate(config=_agent_loop_registry[row.pop("agent_name")],
                                       trainer_config=DictConfigWrap(config=config), server_manager=None,
                                       tokenizer=tokenizer, processor=None, hf_model_type="qwen2",
                                       dataset_cls=None, data_config=DictConfigWrap(config.data),
                                       tools=ToolListWrap([]))
        output = await loop.run({"temperature": 0.0, "top_p": 1.0, "top_k": -1, "logprobs": True}, **row)
        assert isinstance(output, AgentLoopOutput), type(output)
        tensors = output.as_dict()
        outputs.append({**output.model_dump(), "class": type(loop).__qualname__,
                        "as_dict_shapes": {k: list(v.shape) for k, v in tensors.items() if hasattr(v, "shape")}})
    import transformers
    return {"verl": verl.__version__, "transformers": transformers.__version__, "adapter": adapter.__name__,
            "outputs": outputs}


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(sys.argv[1], sys.argv[2]))))
