"""verl's sampling settings reach NeMo Gym's request exactly, and nothing else in the row changes."""

import json

from omegaconf import OmegaConf

from recipe.nemo_gym.rollout_requests import Sampling, build_example, sampling_from_rollout_config

ROLLOUT = OmegaConf.create(
    {
        "temperature": 0.8,
        "top_p": 0.95,
        "top_k": -1,
        "response_length": 512,
        "val_kwargs": {"temperature": 0.6, "top_p": 1.0, "top_k": 20, "do_sample": True},
    }
)

ROW = {
    "responses_create_params": {
        "input": [{"role": "user", "content": "hi"}],
        "tools": [{"type": "function", "name": "f", "parameters": {}}],
        "temperature": 0.1,
        "metadata": None,
    },
    "agent_ref": {"name": "workplace_assistant_simple_agent"},
    "expected_answer": "32",
}


def test_training_sampling_overrides_the_rows_own_and_drops_null_metadata():
    sampling = sampling_from_rollout_config(ROLLOUT, validate=False)
    assert sampling == Sampling(temperature=0.8, top_p=0.95, top_k=-1, max_output_tokens=512)
    example = build_example(ROW, sampling)
    assert example["responses_create_params"] == {
        "input": [{"role": "user", "content": "hi"}],
        "tools": [{"type": "function", "name": "f", "parameters": {}}],
        "temperature": 0.8,
        "top_p": 0.95,
        "max_output_tokens": 512,
    }
    assert example["agent_ref"] == ROW["agent_ref"] and example["expected_answer"] == "32"
    assert ROW["responses_create_params"]["temperature"] == 0.1  # the input row is not mutated


def test_validation_uses_val_kwargs_and_top_k_travels_in_metadata_extra_body():
    row = {**ROW, "responses_create_params": {**ROW["responses_create_params"], "metadata": {"extra_body": '{"a": 1}'}}}
    sampling = sampling_from_rollout_config(ROLLOUT, validate=True)
    assert sampling == Sampling(temperature=0.6, top_p=1.0, top_k=20, max_output_tokens=512)
    params = build_example(row, sampling)["responses_create_params"]
    assert json.loads(params["metadata"]["extra_body"]) == {"a": 1, "top_k": 20}


def test_validation_without_sampling_is_greedy():
    rollout = OmegaConf.merge(ROLLOUT, {"val_kwargs": {"do_sample": False}})
    assert sampling_from_rollout_config(rollout, validate=True).temperature == 0.0
