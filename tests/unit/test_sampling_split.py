"""The split of a v1 ``sampling_params`` into sampler, agent and ignored keys (unit tests)."""
from __future__ import annotations

import pytest

from prorl_celery.llm.sampling import AGENT_KEYS, SAMPLER_KEYS, TRAINER_KEYS, for_protocol, resolve_tokenizer, split

#: what NeMo-RL's ProRL environment and NeMo-Gym's prorl_agent put in sampling_params
V1_PARAMS = {
    "temperature": 1.0, "top_p": 1.0, "max_tokens": 512, "max_iterations": 5, "max_output_tokens": 200,
    "max_input_tokens": 30000, "max_model_len": 32768, "custom_tokenizer": None, "model": "hosted_vllm/policy",
    "api_key": "EMPTY", "modify_params": False, "log_completions": False, "native_tool_calling": False,
    "token_level_generation": True, "ensure_thinking_end_properly": True, "strict_loop_detector": True,
    "is_reasoning_task": True,
}


def test_every_v1_key_lands_in_exactly_one_kind():
    params = split(V1_PARAMS)
    assert params.sampler == {"temperature": 1.0, "top_p": 1.0, "max_tokens": 512}
    assert params.agent == {"max_iterations": 5, "max_output_tokens": 200, "max_input_tokens": 30000,
                            "max_model_len": 32768}  # custom_tokenizer null counts as absent
    assert set(params.ignored) == TRAINER_KEYS
    assert list(params.ignored) == sorted(params.ignored)


def test_unknown_keys_are_ignored_not_sent():
    params = split({"temperature": 0.5, "beam_width": 4, "best_of": 2})
    assert params.sampler == {"temperature": 0.5}
    assert params.ignored == ("beam_width", "best_of")


def test_trainer_and_agent_keys_are_never_sampler_keys():
    for protocol, allowed in SAMPLER_KEYS.items():
        assert not allowed & TRAINER_KEYS, protocol
        assert not allowed & AGENT_KEYS, protocol


@pytest.mark.parametrize("protocol,dropped", [
    ("vllm", ()), ("sglang", ("bad_words", "logit_bias")),
    ("llamacpp", ("bad_words", "logit_bias", "min_tokens", "stop_token_ids"))])
def test_each_protocol_takes_only_its_allow_list(protocol, dropped):
    sampler = {"temperature": 0.7, "stop_token_ids": [1], "min_tokens": 2, "logit_bias": {"3": 1.0},
               "bad_words": ["x"]}
    sent, unsupported = for_protocol(sampler, protocol)
    assert unsupported == dropped
    assert set(sent) == set(sampler) - set(dropped)
    assert set(sent) <= SAMPLER_KEYS[protocol]


def test_custom_tokenizer_resolves_a_directory_or_a_name_under_the_tokenizers_dir(tmp_path):
    (tmp_path / "Qwen3-8B").mkdir()
    (tmp_path / "meta-llama--Llama-3.1-8B").mkdir()
    assert resolve_tokenizer({"custom_tokenizer": "Qwen/Qwen3-8B"}, None, str(tmp_path)) == str(tmp_path / "Qwen3-8B")
    assert resolve_tokenizer({"custom_tokenizer": "meta-llama/Llama-3.1-8B"}, None, str(tmp_path)) == \
        str(tmp_path / "meta-llama--Llama-3.1-8B")
    assert resolve_tokenizer({"custom_tokenizer": str(tmp_path / "Qwen3-8B")}, None, None) == str(tmp_path / "Qwen3-8B")
    assert resolve_tokenizer({"tokenizer": "/x", "custom_tokenizer": "y"}, None, None) == "/x"
    assert resolve_tokenizer({}, "/default", None) == "/default"
    with pytest.raises(ValueError, match="custom_tokenizer: 'nope/none' is not a directory nor under"):
        resolve_tokenizer({"custom_tokenizer": "nope/none"}, None, str(tmp_path))


def test_extra_keys_reach_the_backend_as_they_are():
    """``sampling_params.extra`` is the one way an engine-specific key is sent, on purpose."""
    params = split({"temperature": 0.5, "extra": {"guided_regex": "[0-9]+", "temperature": 9}})
    sent, dropped = for_protocol(params.sampler, "vllm")
    assert sent == {"temperature": 0.5, "guided_regex": "[0-9]+"}  # a named key is not overridden by extra
    assert dropped == () and params.ignored == ()


def test_an_unknown_key_names_the_closest_known_one():
    from prorl_celery.llm.sampling import unknown_key_message
    assert "did you mean 'max_tokens'?" in unknown_key_message("max_token")
    assert "did you mean" not in unknown_key_message("zzzz") and "sampling_params.extra" in unknown_key_message("zzzz")
