# SPDX-License-Identifier: Apache-2.0
"""The splice patch on vLLM 0.24's real chat render and `/tokenize`, with the genuine Qwen3 chat template.

vLLM's `OpenAIServingRender` and `ServingTokenization` are built from the tiny Qwen3 model directory on a CPU
device config (no engine is needed to render). A "generation" is a list of token IDs the test chooses, the
way NeMo Gym's model server would send them back on the next turn.

The tests that build a render object of their own, as a server starts (another tokenizer config, a template without
a turn terminator, the EOS override), and the patch's activation inside verl's Ray actors:
`tests/cpu/integration/test_server_patch.py`.
"""

import asyncio
import contextlib
import importlib
import subprocess
import sys
import threading
import types

import pytest

from recipe.nemo_gym import server_patch
from recipe.nemo_gym.server_patch.request import prefix_eos_count
from recipe.nemo_gym.server_patch.template import EOS_OVERRIDE_ENV
from recipe.nemo_gym.splice.carriers import SpliceError
from tests.support.cpu_policy.qwen3 import ENDOFTEXT, THINK, TOOL_CALL, WEATHER_TOOL
from tests.support.cpu_policy.qwen3 import IM_END as EOS
from tests.support.cpu_policy.tokenizer_calls import counted_tokenizer_calls
from tests.support.helpers import REPO_ROOT as REPO
from tests.support.vllm_render import assistant, chat_ids, chat_render, enc, patched_qwen3_fixtures, per_char
from tests.support.vllm_render import chat_request as _request

TOOLS = [WEATHER_TOOL]


serving, tok = patched_qwen3_fixtures()  # the module's fixtures: the patched render objects and their tokenizer


def tokenize_ids(serving, messages, **fields):
    from vllm.entrypoints.serve.tokenize.protocol import TokenizeChatRequest

    request = TokenizeChatRequest.model_validate({"model": "policy", "messages": messages, **fields})
    return asyncio.run(serving[1].create_tokenize(request, None)).tokens


@contextlib.contextmanager
def unpatched():
    server_patch.uninstall()
    try:
        yield
    finally:
        server_patch.install()


def tool_call(call_id, city):
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": "get_weather", "arguments": f'{{"city": "{city}"}}'},
    }


def tail(tok, text):
    """The IDs the template puts after an assistant turn's content: `<|im_end|>` then `text`."""
    return [EOS, *enc(tok, text)]


# -- requests without token IDs ------------------------------------------------------------------------------

PLAIN_REQUESTS = [
    ([{"role": "user", "content": "Hello"}], {}),
    ([{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Weather?"}], {"tools": TOOLS}),
    ([{"role": "user", "content": "Hi"}], {"chat_template_kwargs": {"enable_thinking": False}}),
    (
        [
            {"role": "user", "content": "2+2?"},
            {"role": "assistant", "content": "<think>\nadd\n</think>\n\n4"},
            {"role": "user", "content": "ok"},
        ],
        {},
    ),
    (
        [{"role": "user", "content": "Say hi"}, {"role": "assistant", "content": "Hi th"}],
        {
            "continue_final_message": True,
            "add_generation_prompt": False,
        },
    ),
]


@pytest.mark.parametrize("messages,fields", PLAIN_REQUESTS)
def test_request_without_token_ids_renders_byte_identical_to_unpatched_vllm(serving, messages, fields):
    conversation, engine_input = chat_render(serving, messages, **fields)
    with unpatched():
        expected_conversation, expected_input = chat_render(serving, messages, **fields)
    engine_input.pop("arrival_time"), expected_input.pop("arrival_time")
    assert engine_input == expected_input
    assert conversation == expected_conversation
    assert tokenize_ids(serving, messages, **fields) == expected_input["prompt_token_ids"]


# -- token-exact histories --------------------------------------------------------------------------------------


def test_drifted_generations_start_the_next_prompts_with_exactly_the_model_ids(serving, tok):
    history = [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Say hello."}]
    prompt = chat_ids(serving, history)
    for turn, text in enumerate(["Hello there, friend.", "Hello again, my friend!"]):
        generation = per_char(tok, text) + [EOS]
        assert generation[:-1] != enc(tok, text)  # the split really drifts from re-tokenization
        history += [assistant(text, prompt, generation), {"role": "user", "content": f"Again {turn}."}]
        next_prompt = chat_ids(serving, history)
        expected = (
            prompt + generation + enc(tok, f"\n<|im_start|>user\nAgain {turn}.<|im_end|>\n<|im_start|>assistant\n")
        )
        assert next_prompt == expected
        with unpatched():
            assert chat_ids(serving, history)[: len(prompt + generation)] != prompt + generation
        prompt = next_prompt


def test_qwen3_reasoning_stripped_from_history_then_short_user_turn_is_exact(serving, tok):
    history = [{"role": "user", "content": "What is 2+2?"}]
    prompt = chat_ids(serving, history)
    text = "<think>\nTwo plus two is four.\n</think>\n\nIt is 4."
    generation = enc(tok, text) + [EOS]
    history += [assistant(text, prompt, generation), {"role": "user", "content": "ok"}]
    with unpatched():
        assert THINK not in chat_ids(serving, history)  # the template strips the reasoning from history
    assert chat_ids(serving, history) == prompt + generation + enc(
        tok, "\n<|im_start|>user\nok<|im_end|>\n<|im_start|>assistant\n"
    )


def test_tool_call_turn_then_tool_result_contains_the_assistant_turn_once(serving, tok):
    history = [{"role": "user", "content": "Weather in Paris?"}]
    prompt = chat_ids(serving, history, tools=TOOLS)
    # Compact JSON: the template re-serialises it with spaces, so re-rendering would not reproduce it.
    generation = enc(tok, '<tool_call>\n{"name":"get_weather","arguments":{"city":"Paris"}}\n</tool_call>') + [EOS]
    history += [
        assistant("", prompt, generation, tool_calls=[tool_call("c1", "Paris")]),
        {"role": "tool", "tool_call_id": "c1", "content": "18C, sunny"},
    ]
    ids = chat_ids(serving, history, tools=TOOLS)
    assert ids == prompt + generation + enc(
        tok, "\n<|im_start|>user\n<tool_response>\n18C, sunny\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
    assert ids.count(TOOL_CALL) == prompt.count(TOOL_CALL) + 1


def test_parallel_tool_calls_in_one_message_are_exact(serving, tok):
    history = [{"role": "user", "content": "Weather in Paris and Rome?"}]
    prompt = chat_ids(serving, history, tools=TOOLS)
    calls = "".join(
        f'<tool_call>\n{{"name":"get_weather","arguments":{{"city":"{c}"}}}}\n</tool_call>' for c in ("Paris", "Rome")
    )
    generation = enc(tok, calls) + [EOS]
    history += [
        assistant("", prompt, generation, tool_calls=[tool_call("c1", "Paris"), tool_call("c2", "Rome")]),
        {"role": "tool", "tool_call_id": "c1", "content": "18C"},
        {"role": "tool", "tool_call_id": "c2", "content": "20C"},
    ]
    responses = "<tool_response>\n18C\n</tool_response>\n<tool_response>\n20C\n</tool_response>"
    assert chat_ids(serving, history, tools=TOOLS) == prompt + generation + enc(
        tok, f"\n<|im_start|>user\n{responses}<|im_end|>\n<|im_start|>assistant\n"
    )


def _parallel_history(serving, tok):
    prompt = chat_ids(serving, [{"role": "user", "content": "Paris and Rome?"}], tools=TOOLS)
    calls = "".join(
        f'<tool_call>\n{{"name": "get_weather", "arguments": {{"city": "{c}"}}}}\n</tool_call>'
        for c in ("Paris", "Rome")
    )
    return prompt, enc(tok, calls) + [EOS]


def test_parallel_tool_calls_split_into_two_messages_ids_on_second_are_refused(serving, tok):
    prompt, generation = _parallel_history(serving, tok)
    history = [
        {"role": "user", "content": "Paris and Rome?"},
        {"role": "assistant", "content": "", "tool_calls": [tool_call("c1", "Paris")]},
        assistant("", prompt, generation, tool_calls=[tool_call("c2", "Rome")]),
        {"role": "tool", "tool_call_id": "c1", "content": "18C"},
        {"role": "tool", "tool_call_id": "c2", "content": "20C"},
    ]
    with pytest.raises(SpliceError, match=r"rule 2 .*hold 3 EOS.*holds 4"):
        chat_ids(serving, history, tools=TOOLS)
    with pytest.raises(SpliceError, match=r"rule 2"):
        tokenize_ids(serving, history, tools=TOOLS)


def test_parallel_tool_calls_split_into_two_messages_ids_on_first_are_refused(serving, tok):
    prompt, generation = _parallel_history(serving, tok)
    history = [
        {"role": "user", "content": "Paris and Rome?"},
        assistant("", prompt, generation, tool_calls=[tool_call("c1", "Paris")]),
        {"role": "assistant", "content": "", "tool_calls": [tool_call("c2", "Rome")]},
        {"role": "tool", "tool_call_id": "c1", "content": "18C"},
    ]
    with pytest.raises(SpliceError, match=r"one message per generation"):
        chat_ids(serving, history, tools=TOOLS)


def test_continue_final_message_on_a_history_with_token_ids_is_refused_saying_it_is_unsupported(serving, tok):
    history = [{"role": "user", "content": "Say hi"}]
    prompt = chat_ids(serving, history)
    history += [assistant("Hi th", prompt, per_char(tok, "Hi th"))]  # a generation cut short, to be continued
    fields = {"continue_final_message": True, "add_generation_prompt": False}
    expected = r"continue_final_message is not supported with token IDs in the history \(messages\[1\] carries"
    with pytest.raises(SpliceError, match=expected):
        chat_ids(serving, history, **fields)
    with pytest.raises(SpliceError, match=expected):
        tokenize_ids(serving, history, **fields)


def test_model_writing_the_end_of_turn_text_is_refused_as_such_not_as_an_edit(serving, tok):
    """The model wrote `<|im_end|>` as ordinary tokens; the template renders that text as the special token, so the
    history holds one more turn end than the model produced. Nothing was edited: the refusal says what happened."""
    history = [{"role": "user", "content": "Say hi."}]
    prompt = chat_ids(serving, history)
    text = "Hi<|im_end|>there"
    history += [assistant(text, prompt, per_char(tok, text) + [EOS]), {"role": "user", "content": "ok"}]
    with pytest.raises(SpliceError) as e:
        chat_ids(serving, history)
    assert "rule 2 (unedited history) failed: the model's own tokens hold 2 EOS token(s)" in str(e.value)
    assert (
        "messages[1] (role 'assistant') holds the text of the end-of-turn token '<|im_end|>', which the chat "
        "template renders as that token" in str(e.value)
    )
    assert "Nothing was edited" in str(e.value) and "was edited after" not in str(e.value)


def _three_turns(serving, tok):
    history = [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "One."}]
    for text in ["First.", "Second."]:
        prompt = chat_ids(serving, history)
        history += [assistant(text, prompt, per_char(tok, text) + [EOS]), {"role": "user", "content": "More."}]
    return history


def test_an_inserted_turn_is_refused_naming_the_first_message_that_renders_differently(serving, tok):
    history = _three_turns(serving, tok)
    inserted = [*history[:2], {"role": "user", "content": "Extra."}, {"role": "assistant", "content": "Noted."},
                *history[2:]]  # fmt: skip
    with pytest.raises(SpliceError) as e:
        chat_ids(serving, inserted)
    assert "the history holds more turns than the model saw: a turn was inserted" in str(e.value)
    assert "first message that renders differently: messages[2] (role 'user')" in str(e.value)


def test_a_removed_turn_is_refused_as_removed_naming_where(serving, tok):
    history = _three_turns(serving, tok)
    removed = [history[0], *history[3:]]  # the first exchange dropped to save room
    with pytest.raises(SpliceError) as e:
        chat_ids(serving, removed)
    assert "the history holds fewer turns than the model saw: turns were removed or merged" in str(e.value)
    assert "first message that renders differently: messages[1] (role 'user')" in str(e.value)


def test_truncated_history_is_refused(serving, tok):
    history = [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "One."}]
    for text in ["First.", "Second."]:
        prompt = chat_ids(serving, history)
        history += [assistant(text, prompt, enc(tok, text) + [EOS]), {"role": "user", "content": "More."}]
    truncated = [history[0], *history[3:]]  # the agent dropped the first exchange to save room
    with pytest.raises(SpliceError, match=r"rule 2 .*hold 5 EOS.*holds 3"):
        chat_ids(serving, truncated)


def _two_model_turns(serving, tok, tools=None):
    """System, user, model turn, user, model turn, user: a history whose EOS count every edit below keeps."""
    fields = {"tools": tools} if tools else {}
    history = [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "My name is Ada."}]
    for text, follow in [("Hi Ada.", "What is my name?"), ("Ada.", "Thanks.")]:
        prompt = chat_ids(serving, history, **fields)
        history += [assistant(text, prompt, per_char(tok, text) + [EOS]), {"role": "user", "content": follow}]
    return history


def test_system_prompt_changed_between_turns_is_refused_naming_the_system_message(serving, tok):
    history = _two_model_turns(serving, tok)
    history[0] = {"role": "system", "content": "Be verbose."}
    with pytest.raises(SpliceError, match=r"rule 4 .*first edited message: messages\[0\] \(role 'system'\)"):
        chat_ids(serving, history)


def test_earlier_user_message_redacted_is_refused_naming_it(serving, tok):
    history = _two_model_turns(serving, tok)
    history[1] = {"role": "user", "content": "My name is [redacted]."}
    with pytest.raises(SpliceError, match=r"rule 4 .*first edited message: messages\[1\] \(role 'user'\)"):
        chat_ids(serving, history)
    with pytest.raises(SpliceError, match=r"rule 4"):
        tokenize_ids(serving, history)


@pytest.mark.parametrize("before,after", [(None, TOOLS), (TOOLS, None)], ids=["tools_added", "tools_removed"])
def test_tools_changed_at_turn_two_are_refused(serving, tok, before, after):
    history = _two_model_turns(serving, tok, tools=before)
    fields = {"tools": after} if after else {}
    with pytest.raises(SpliceError, match=r"rule 4 \(unedited history\) failed: the history before messages\[2\]"):
        chat_ids(serving, history, **fields)


def test_unedited_two_turn_history_is_spliced_exactly(serving, tok):
    history = _two_model_turns(serving, tok)
    last = history[-2]
    assert chat_ids(serving, history) == last["prompt_token_ids"] + last["generation_token_ids"] + enc(
        tok, "\n<|im_start|>user\nThanks.<|im_end|>\n<|im_start|>assistant\n"
    )


def test_assistant_with_empty_id_lists_is_refused_naming_the_message(serving, tok):
    history = [
        {"role": "user", "content": "Hi."},
        assistant("Hello.", [], []),
        {"role": "user", "content": "Bye."},
    ]
    with pytest.raises(SpliceError, match=r"messages\[1\]\.prompt_token_ids is empty"):
        chat_ids(serving, history)


def test_refusals_and_vllm_value_errors_are_vllm_validation_errors(serving, tok):
    """vLLM answers its `VLLMValidationError` with a 400 that keeps the connection; a plain ValueError's 400
    comes from the catch-all handler, which re-raises it (traceback, connection closed)."""
    from vllm.exceptions import VLLMValidationError

    history = _two_model_turns(serving, tok)
    with pytest.raises(VLLMValidationError, match=r"token-exact splice refused: rule 2"):
        chat_ids(serving, [history[0], *history[3:]])
    bad_arguments = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{city"}}
    plain = [
        {"role": "user", "content": "Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [bad_arguments]},
        {"role": "tool", "tool_call_id": "c1", "content": "18C"},
    ]
    with pytest.raises(VLLMValidationError):
        chat_ids(serving, plain, tools=TOOLS)


def test_generation_cut_at_length_limit_keeps_every_token_and_template_closes_the_turn(serving, tok):
    history = [{"role": "user", "content": "Count."}]
    prompt = chat_ids(serving, history)
    generation = per_char(tok, "One, two, thr")  # max_tokens reached: no EOS
    history += [assistant("One, two, thr", prompt, generation), {"role": "user", "content": "Go on."}]
    assert chat_ids(serving, history) == prompt + generation + tail(
        tok, "\n<|im_start|>user\nGo on.<|im_end|>\n<|im_start|>assistant\n"
    )


def test_generation_ended_on_other_stop_token_keeps_it_before_the_template_eos(serving, tok):
    history = [{"role": "user", "content": "Hi."}]
    prompt = chat_ids(serving, history)
    generation = enc(tok, "Hello.") + [ENDOFTEXT]
    history += [assistant("Hello.", prompt, generation), {"role": "user", "content": "Bye."}]
    assert chat_ids(serving, history) == prompt + generation + tail(
        tok, "\n<|im_start|>user\nBye.<|im_end|>\n<|im_start|>assistant\n"
    )


def test_tokenize_returns_the_chat_path_ids_for_spliced_histories(serving, tok):
    history = [{"role": "user", "content": "Weather in Paris?"}]
    prompt = tokenize_ids(serving, history, tools=TOOLS)
    assert prompt == chat_ids(serving, history, tools=TOOLS)
    generation = per_char(tok, '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>')
    history += [
        assistant("", prompt, generation + [EOS], tool_calls=[tool_call("c1", "Paris")]),
        {"role": "tool", "tool_call_id": "c1", "content": "18C"},
    ]
    spliced = tokenize_ids(serving, history, tools=TOOLS)
    assert spliced[: len(prompt) + len(generation) + 1] == prompt + generation + [EOS]
    assert spliced == chat_ids(serving, history, tools=TOOLS)


def test_tool_calls_given_as_one_shot_iterators_are_rendered_twice_correctly(serving, tok):
    prompt = chat_ids(serving, [{"role": "user", "content": "Paris?"}], tools=TOOLS)
    generation = enc(tok, '<tool_call>\n{"name":"get_weather","arguments":{"city":"Paris"}}\n</tool_call>') + [EOS]
    history = [
        {"role": "user", "content": "Paris?"},
        assistant("", prompt, generation, tool_calls=[tool_call("c1", "Paris")]),
        {"role": "tool", "tool_call_id": "c1", "content": "18C"},
    ]
    expected = chat_ids(serving, history, tools=TOOLS)
    request = _request(history, tools=TOOLS)
    request.messages[1]["tool_calls"] = iter(request.messages[1]["tool_calls"])  # an in-process caller's iterator
    _, (engine_input,) = asyncio.run(serving[0].render_chat(request))
    assert engine_input["prompt_token_ids"] == expected


def _reasoning_history(serving, tok):
    """A turn whose reasoning the template strips from history: the spliced IDs keep it, the full render not."""
    history = [{"role": "user", "content": "Hi."}]
    prompt = chat_ids(serving, history)
    text = "<think>\nGreet back.\n</think>\n\nHey!"
    history += [assistant(text, prompt, enc(tok, text) + [EOS]), {"role": "user", "content": "Bye."}]
    return history


def test_spliced_prompt_text_is_left_out_when_vllm_would_not_read_it(serving, tok):
    """vLLM's text there is the full render's, which is not the text of the spliced IDs (here it lacks the
    reasoning), and vLLM 0.24 reads it only to log it or to return it (`return_prompt_text`). Without either
    it is left out rather than decoded, and the engine gets a prompt of token IDs only."""
    history = _reasoning_history(serving, tok)
    with unpatched():
        _, vllm_input = chat_render(serving, history)
    assert "<think>" not in vllm_input["prompt"]
    _, engine_input = chat_render(serving, history)
    assert engine_input.keys() == vllm_input.keys() - {"prompt"}
    assert THINK in engine_input["prompt_token_ids"]


def test_spliced_prompt_text_is_the_text_of_the_spliced_ids_when_return_prompt_text_is_set(serving, tok):
    _, engine_input = chat_render(serving, _reasoning_history(serving, tok), return_prompt_text=True)
    assert engine_input["prompt"] == tok.decode(engine_input["prompt_token_ids"])
    assert "<think>\nGreet back.\n</think>\n\nHey!<|im_end|>" in engine_input["prompt"]


def test_spliced_prompt_text_is_the_text_of_the_spliced_ids_when_requests_are_logged(serving, tok, monkeypatch):
    from vllm.entrypoints.serve.utils.request_logger import RequestLogger

    monkeypatch.setattr(serving[0], "request_logger", RequestLogger(max_log_len=None))
    _, engine_input = chat_render(serving, _reasoning_history(serving, tok))
    assert engine_input["prompt"] == tok.decode(engine_input["prompt_token_ids"])
    assert "<think>\nGreet back.\n</think>\n\nHey!<|im_end|>" in engine_input["prompt"]


def test_spliced_request_costs_one_extra_template_render_and_no_extra_tokenization(serving, tok):
    history = _reasoning_history(serving, tok)
    with unpatched(), counted_tokenizer_calls(tok) as vllm_counts:
        chat_ids(serving, history)
    with counted_tokenizer_calls(tok) as counts:
        chat_ids(serving, history)
    assert vllm_counts == {"apply_chat_template": 1, "encode": 1}
    assert counts == {"apply_chat_template": 2, "encode": 1}


def test_prefix_eos_count_is_taken_on_the_text_without_tokenizing_when_the_full_render_agrees(tok):
    prefix_text = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nyo<|im_end|>\n"
    full_text = prefix_text + "<|im_start|>user\nok<|im_end|>\n<|im_start|>assistant\n"
    full = {"prompt": full_text, "prompt_token_ids": enc(tok, full_text)}
    with counted_tokenizer_calls(tok) as counts:
        assert prefix_eos_count(tok, {"prompt": prefix_text}, full, EOS, False) == 2
    assert counts["encode"] == 0


def test_prefix_eos_count_tokenizes_the_prefix_when_the_eos_text_does_not_map_to_one_token(tok):
    """A token whose text also occurs inside other tokens: counting the text would give 2, the IDs hold 1."""
    (dot,) = enc(tok, ".")
    text = "see main.py now."
    assert text.count(".") == 2 and enc(tok, text).count(dot) == 1
    full = {"prompt": text, "prompt_token_ids": enc(tok, text)}
    assert prefix_eos_count(tok, {"prompt": text}, full, dot, False) == 1


def test_prefix_eos_count_of_an_ordinary_token_is_taken_on_ids_even_where_the_full_render_agrees(tok):
    """The full render's text and IDs agree on '.', but only a special token's text is always one token."""
    (dot,) = enc(tok, ".")
    full_text, prefix_text = "Hi. Bye.", "see main.py now."
    assert full_text.count(".") == enc(tok, full_text).count(dot) == 2
    full = {"prompt": full_text, "prompt_token_ids": enc(tok, full_text)}
    assert prefix_eos_count(tok, {"prompt": prefix_text}, full, dot, False) == 1


def test_prefix_eos_count_tokenizes_the_prefix_when_the_full_render_has_no_text(tok):
    text = "<|im_start|>user\nhi<|im_end|>\n"
    assert prefix_eos_count(tok, {"prompt": text}, {"prompt_token_ids": enc(tok, text)}, EOS, False) == 1


def test_prefix_eos_count_counts_ids_when_the_renderer_tokenized_while_rendering(tok):
    ids = enc(tok, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nyo<|im_end|>\n")
    assert prefix_eos_count(tok, {"prompt_token_ids": ids}, {"prompt_token_ids": ids}, EOS, False) == 2


def test_eos_override_from_environment_is_used(serving, tok, monkeypatch):
    history = [{"role": "user", "content": "Hi."}]
    prompt = chat_ids(serving, history)
    history += [assistant("Hey", prompt, enc(tok, "Hey") + [EOS]), {"role": "user", "content": "Bye."}]
    monkeypatch.setenv(EOS_OVERRIDE_ENV, str(ENDOFTEXT))  # not the template's turn terminator
    with pytest.raises(SpliceError, match=r"rule 1 .*no EOS token 151643"):
        chat_ids(serving, history)


def test_nemo_gym_token_id_keys_survive_vllm_request_validation():
    message = assistant("hi", [1, 2], ["3", 4], tool_calls=[tool_call("c1", "Paris")])
    kept = _request([{"role": "user", "content": "a"}, message]).messages[1]
    assert kept["prompt_token_ids"] == [1, 2] and kept["generation_token_ids"] == ["3", 4]


# -- installation ----------------------------------------------------------------------------------------------


def test_install_is_idempotent_and_uninstall_restores_vllm_method(serving):
    from vllm.entrypoints.serve.render.serving import OpenAIServingRender

    patched = OpenAIServingRender.preprocess_chat
    server_patch.install()
    assert OpenAIServingRender.preprocess_chat is patched and server_patch.is_installed()
    server_patch.uninstall()
    assert not server_patch.is_installed()
    assert OpenAIServingRender.preprocess_chat.__qualname__ == "OpenAIServingRender.preprocess_chat"
    server_patch.install()
    assert server_patch.is_installed()


def test_install_refuses_a_vllm_without_a_known_chat_preprocessor_naming_the_version():
    def no_module(name):
        raise ModuleNotFoundError(name)

    with pytest.raises(
        server_patch.UnsupportedVLLMError, match=r"vLLM 0\.24\.0(\+cpu)? is not supported.*OnlineRenderer"
    ):
        server_patch.resolve_target(no_module)


def test_install_refuses_a_preprocess_chat_with_another_signature_naming_the_version():
    class OldRender:  # vLLM before `tool_parser` became `parser`
        async def preprocess_chat(
            self,
            request,
            messages,
            default_template,
            default_template_content_format,
            default_template_kwargs,
            tool_parser,
        ):
            raise AssertionError

    def fake_import(name):
        if name == "vllm.entrypoints.serve.render.serving":
            return types.SimpleNamespace(OpenAIServingRender=OldRender)
        raise ModuleNotFoundError(name)

    with pytest.raises(
        server_patch.UnsupportedVLLMError, match=r"vLLM 0\.24\.0(\+cpu)?: .*without \['tool_dicts', 'parser'\]"
    ):
        server_patch.resolve_target(fake_import)


def test_install_refuses_a_renderer_without_the_template_only_step_naming_the_version():
    from vllm.entrypoints.serve.render import serving as render_serving

    class RendererWithoutTemplateStep:  # a vLLM whose renderer only renders and tokenizes in one call
        async def render_chat_async(self, *args, **kwargs):
            raise AssertionError

    def fake_import(name):
        if name == "vllm.entrypoints.serve.render.serving":
            return render_serving
        if name == "vllm.renderers":
            return types.SimpleNamespace(BaseRenderer=RendererWithoutTemplateStep)
        raise ModuleNotFoundError(name)

    with pytest.raises(
        server_patch.UnsupportedVLLMError,
        match=r"vLLM 0\.24\.0(\+cpu)?: vllm\.renderers\.BaseRenderer\.render_messages_async",
    ):
        server_patch.resolve_target(fake_import)


def test_importing_server_patch_neither_imports_vllm_nor_patches():
    code = (
        "import sys, recipe.nemo_gym.server_patch as p; "
        "assert not any(m == 'vllm' or m.startswith('vllm.') for m in sys.modules), 'vllm imported'; print('ok')"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


# -- vLLM 0.24's hermes tool parser under concurrency -----------------------------------------------------------


def test_hermes_tool_parser_and_renders_share_the_tokenizer_across_threads_without_already_borrowed(serving, tok):
    """The old race: the hermes parser called the tokenizer while a render thread held it mutably
    ("RuntimeError: Already borrowed"). vLLM 0.24 routes the tokenizer's public calls through a pool of
    copies; this hammers renders (truncating encodes), parser construction, vocab and decode at once."""
    parser_cls = importlib.import_module("vllm.tool_parsers.hermes_tool_parser").Hermes2ProToolParser
    request = _request([{"role": "user", "content": "Paris?"}], tools=TOOLS)
    output = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    long_text = "lorem ipsum dolor sit amet " * 400
    errors: list[BaseException] = []
    start = threading.Barrier(8)

    def work(kind):
        try:
            start.wait()
            for _ in range(40):
                if kind == 0:
                    tok.encode(long_text, truncation=True, max_length=64)
                elif kind == 1:
                    parser = parser_cls(tok, request.tools)
                    assert parser.extract_tool_calls(output, request).tools_called
                    assert parser.vocab["<tool_call>"] == TOOL_CALL
                elif kind == 2:
                    tok.decode(enc(tok, output))
                else:
                    chat_ids(serving, [{"role": "user", "content": long_text[:200]}], tools=TOOLS)
        except BaseException as exc:  # noqa: BLE001 - every failure in a thread must reach the assertion
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i % 4,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not any(t.is_alive() for t in threads)
    assert errors == []
