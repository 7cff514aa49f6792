"""``ProrlRollout``'s two paths and its sampler seeds, against the real service (gateway, Celery
pools, the python tool in its sandbox) and the scripted LLM server on the real Qwen3 template.

The token path hands TRL the service's ids and logprobs; the text path (``path="text"``) is what
a trainer that receives text builds: the messages re-rendered and re-tokenized. On Qwen3 the
template writes an empty think block into the last assistant turn, which the policy never
produced; the text path must show exactly that and nothing else for canonical replies.
"""
from __future__ import annotations

from types import SimpleNamespace

from prorl_celery.llm.tokenizer import load_tokenizer
from prorl_celery.trainer.integrations.trl import ProrlRollout

SAMPLING = {"temperature": 1.0, "max_tokens": 48}


def trainer_at(step: int) -> SimpleNamespace:
    """What ProrlRollout reads of a TRL trainer: the step and the tokenizer's eos."""
    return SimpleNamespace(state=SimpleNamespace(global_step=step), args=None, processing_class=None)




def test_text_path_is_the_template_rendering_without_logprobs(gateway, backend, qwen3_tokenizer):
    instance = {"data_source": "math", "problem": "PYTOOL: what is 6 times 7?", "answer": "42", "tools": ["python"],
                "max_iterations": 3}
    prompts = [instance["problem"]] * 2
    chat = load_tokenizer(qwen3_tokenizer)
    token = ProrlRollout(gateway.cluster.gateway_url, instance_for=lambda _: dict(instance), sampling_params=SAMPLING)
    text = ProrlRollout(gateway.cluster.gateway_url, instance_for=lambda _: dict(instance), sampling_params=SAMPLING,
                        path="text", text_tokenizer=chat)
    try:
        by_token, by_text = token(prompts, trainer_at(0)), text(prompts, trainer_at(0))
    finally:
        token.close()
        text.close()
    assert by_token["status"] == by_text["status"] == ["completed"] * 2 and by_text["service_reward"] == [1.0, 1.0]
    assert by_text["logprobs"] is None and len(by_token["logprobs"][0]) == len(by_token["completion_ids"][0])
    think = chat.encode("<think>\n\n</think>\n\n")
    for row, result in enumerate(text.results):
        assert result["trajectory"]["num_turns"] == 2  # the tool call, its output, the answer
        completion, mask = by_token["completion_ids"][row], by_token["env_mask"][row]
        assert by_text["prompt_ids"][row] == by_token["prompt_ids"][row]
        # the last assistant turn starts after the last observation (mask 0) token
        last = max(k for k, m in enumerate(mask) if m == 0) + 1
        assert by_text["completion_ids"][row] == completion[:last] + think + completion[last:]
        assert by_text["env_mask"][row] == mask[:last] + [1] * len(think) + mask[last:]
        assert by_text["completion_ids"][row][-1] == chat.eot_id
    assert text.path_stats == [{"trajectories": 2, "trajectories_differ": 1.0, "model_tokens_lost": 0.0,
                                "model_tokens_added_per_trajectory": float(len(think))}]


def test_seeded_rollouts_repeat_across_runs_and_differ_within_a_group(gateway, random_llm_servers):
    # no rules: the scripted server replies with ids drawn from (prompt, request seed)
    server = random_llm_servers["qwen3"]
    gateway.post("/add_llm_server", json={"address": server.address()}).raise_for_status()
    instance = {"data_source": "math", "problem": "What is 1 + 1?", "answer": "2", "max_iterations": 1}
    prompts = ["a"] * 4 + ["b"] * 4

    def completions(seed: int | None, step: int) -> list[tuple[int, ...]]:
        rollout = ProrlRollout(gateway.cluster.gateway_url, instance_for=lambda _: dict(instance),
                               sampling_params=SAMPLING, seed=seed)
        try:
            out = rollout(prompts, trainer_at(step))
        finally:
            rollout.close()
        assert out["status"] == ["completed"] * len(prompts)
        # the jobs are still groups: ids <group>-<i>, trajectory_id i
        assert [r["job_id"].rsplit("-", 1)[1] for r in rollout.results] == ["0", "1", "2", "3"] * 2
        return [tuple(ids) for ids in out["completion_ids"]]

    first = completions(seed=5, step=3)
    assert completions(seed=5, step=3) == first  # the same samples from the same weights
    assert len(set(first)) == len(prompts)  # yet every rollout its own seed
    assert completions(seed=5, step=4) != first and completions(seed=6, step=3) != first
