# SPDX-License-Identifier: Apache-2.0
"""The splice patch where a server starts: vLLM 0.24's render objects built as a server builds them, and the patch's
activation inside verl's Ray actors.

- Render objects of their own (a server's renderer start-up, 5-8 s each): a tokenizer config whose EOS is not the
  template's turn terminator, a template without a turn terminator (refused at start-up), the EOS override named
  by `NEMO_GYM_SPLICE_EOS_TOKEN_ID`, each against the module's patched Qwen3 render.
- verl's `run_ppo` with the documented override, in a child process with its own Ray: the patch is installed in a
  Ray actor started with a runtime_env of its own.

The patch on one shared render object (requests, refusals, installation):
`tests/cpu/unit/server_patch/test_server_patch_units.py`.
"""

import json
import os
import subprocess
import sys

import pytest

from recipe.nemo_gym.server_patch.template import EOS_OVERRIDE_ENV, TemplateWithoutTerminatorError
from recipe.nemo_gym_demo.tiny_model import tiny_qwen3_dir
from tests.support.cpu_policy.qwen3 import ENDOFTEXT
from tests.support.cpu_policy.qwen3 import IM_END as EOS
from tests.support.helpers import REPO_ROOT as REPO
from tests.support.vllm_render import (
    assistant,
    build_render_serving,
    chat_ids,
    enc,
    patched_qwen3_fixtures,
    per_char,
)

pytestmark = pytest.mark.integration


serving, tok = patched_qwen3_fixtures()  # the module's fixtures: the patched render objects and their tokenizer


# -- render objects built as a server builds them -----------------------------------------------------------------


def _model_dir_with(tmp_path, tokenizer_config_update):
    """The tiny Qwen3 model directory with its tokenizer_config.json changed, as another published config."""
    import shutil

    target = tmp_path / "model"
    shutil.copytree(tiny_qwen3_dir(), target)
    config = json.loads((target / "tokenizer_config.json").read_text())
    config.update(tokenizer_config_update)
    (target / "tokenizer_config.json").write_text(json.dumps(config))
    return target


def test_tokenizer_whose_eos_is_not_the_template_terminator_splices_on_the_template_terminator(serving, tmp_path):
    """A base model's config (EOS `<|endoftext|>`) with the instruct chat template: the turns end with
    `<|im_end|>`, which the probe render finds; counting `<|endoftext|>` refused every request."""
    render, _ = build_render_serving(str(_model_dir_with(tmp_path, {"eos_token": "<|endoftext|>"})))
    base = (render, None)
    tok = render.renderer.tokenizer
    assert tok.eos_token_id == ENDOFTEXT
    history = [{"role": "user", "content": "Hi."}]
    prompt = chat_ids(base, history)
    generation = per_char(tok, "Hello there.") + [EOS]
    history += [assistant("Hello there.", prompt, generation), {"role": "user", "content": "Bye."}]
    assert chat_ids(base, history) == prompt + generation + enc(
        tok, "\n<|im_start|>user\nBye.<|im_end|>\n<|im_start|>assistant\n"
    )


GLM_LIKE_TEMPLATE = (
    "[gMASK]<sop>{% for m in messages %}<|{{ m.role }}|>\n{{ m.content }}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def test_template_without_turn_terminator_fails_when_the_server_builds_its_renderer(serving):
    """No special token after an assistant message (GLM 4.x: the next role tag follows the content): refused at
    start-up, naming the template and the override, instead of per request as an edited history."""
    with pytest.raises(
        TemplateWithoutTerminatorError,
        match=r"chat template given to vLLM \(--chat-template\) writes no special token after an assistant "
        r"message.*NEMO_GYM_SPLICE_EOS_TOKEN_ID",
    ):
        build_render_serving(str(tiny_qwen3_dir()), chat_template=GLM_LIKE_TEMPLATE)


def test_an_override_the_template_does_not_write_after_a_turn_is_refused_at_start_up(serving, monkeypatch):
    """The override names a token; where the template never writes it after an assistant message (GLM's
    `<|user|>` opens the next turn instead), every request would be refused as an edited history: refused at
    start-up instead, saying why."""
    monkeypatch.setenv(EOS_OVERRIDE_ENV, str(EOS))
    with pytest.raises(
        TemplateWithoutTerminatorError,
        match=rf"NEMO_GYM_SPLICE_EOS_TOKEN_ID={EOS} \('<\|im_end\|>'\) is not written by the chat template given to "
        r"vLLM \(--chat-template\) after an assistant message \(it writes '' there\)",
    ):
        build_render_serving(str(tiny_qwen3_dir()), chat_template=GLM_LIKE_TEMPLATE)


def test_an_override_naming_the_templates_own_terminator_starts_and_splices(serving, tok, monkeypatch):
    monkeypatch.setenv(EOS_OVERRIDE_ENV, str(EOS))
    render, _ = build_render_serving(str(tiny_qwen3_dir()))
    history = [{"role": "user", "content": "Say hello."}]
    prompt = chat_ids((render, None), history)
    generation = per_char(tok, "Hello there.") + [EOS]
    history += [assistant("Hello there.", prompt, generation), {"role": "user", "content": "Again."}]
    assert chat_ids((render, None), history)[: len(prompt) + len(generation)] == prompt + generation


# -- activation inside verl's vLLM server actors -----------------------------------------------------------------

VERL_OVERRIDE = "+ray_kwargs.ray_init.runtime_env.env_vars.VERL_USE_EXTERNAL_MODULES=recipe.nemo_gym.vllm_plugin"

RAY_PROBE = """
import json, os, sys
import ray
from hydra import compose, initialize_config_dir
import verl.trainer.main_ppo as main_ppo

@ray.remote(num_cpus=0)
class ServerLike:
    def probe(self):
        import verl  # verl's vLLMHttpServer is defined in a verl module, so its actor process imports verl
        plugin = "recipe.nemo_gym.vllm_plugin" in sys.modules
        vllm_before = any(m == "vllm" or m.startswith("vllm.") for m in sys.modules)
        import vllm.entrypoints.openai.api_server  # what vLLMHttpServer imports to build vLLM's app
        from recipe.nemo_gym import server_patch
        return {"plugin": plugin, "vllm_before": vllm_before, "installed": server_patch.is_installed(),
                "actor_env": os.environ.get("ACTOR_ONLY")}

@ray.remote(num_cpus=0)
class Runner:
    def run(self, config):
        # Like vLLMReplica.launch_servers: the server actor gets a runtime_env with env_vars of its own.
        server = ServerLike.options(runtime_env={"env_vars": {"ACTOR_ONLY": "1"}}).remote()
        with open(RESULT, "w") as f:
            json.dump(ray.get(server.probe.remote()), f)

config_dir = os.path.join(os.path.dirname(main_ppo.__file__), "config")
with initialize_config_dir(config_dir=config_dir, version_base=None):
    config = compose("ppo_trainer", overrides=[OVERRIDE, "ray_kwargs.ray_init.num_cpus=2"])
try:
    main_ppo.run_ppo(config, task_runner_class=Runner)  # verl's own ray.init with its runtime_env merge
finally:
    ray.shutdown()
"""


def test_verl_override_activates_the_patch_in_a_ray_server_actor_through_verl_run_ppo(tmp_path):
    """verl's run_ppo with the documented override: the env var reaches an actor started with its own
    runtime_env, verl's import loads the plugin without importing vLLM, and vLLM's app import installs it."""
    result = tmp_path / "result.json"
    script = tmp_path / "probe.py"
    script.write_text(f"RESULT = {str(result)!r}\nOVERRIDE = {VERL_OVERRIDE!r}\n" + RAY_PROBE)
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAY_DISABLE_DOCKER_CPU_WARNING": "1"}
    env.pop("VERL_USE_EXTERNAL_MODULES", None)
    out = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stderr[-4000:]
    assert json.loads(result.read_text()) == {"plugin": True, "vllm_before": False, "installed": True, "actor_env": "1"}
