# SPDX-License-Identifier: Apache-2.0
"""The pure splice: exact outputs for each rule, and the refusals with their counts (EOS is 9 throughout)."""

import pytest

from recipe.nemo_gym.splice.carriers import Generation, SpliceError, TruePrefix, find_true_prefix, has_token_ids
from recipe.nemo_gym.splice.eos_splice import (
    check_and_splice,
    count_eos_in_text,
    splice_prompt_ids,
    splice_with_eos_count,
)
from recipe.nemo_gym.splice.history_guard import EditedHistory, check_unedited_history
from recipe.nemo_gym.splice.template_probe import (
    GenerationPrompt,
    ProbeRenders,
    read_generation_prompt,
    text_after_assistant,
    turn_terminator,
)

EOS = 9


def test_splice_keeps_model_tokens_then_full_render_from_nth_eos():
    true_prefix = [1, 2, EOS, 3, 4, EOS]  # prompt [1, 2, 9, 3], generation [4, 9]
    prefix_render = [1, 2, EOS, 3, 5, EOS, 7]  # the template re-tokenized the generation as [5]
    full_render = [1, 2, EOS, 3, 5, EOS, 7, 8, EOS, 3]
    assert splice_prompt_ids(true_prefix, prefix_render, full_render, EOS) == [1, 2, EOS, 3, 4, EOS, 7, 8, EOS, 3]


def test_splice_counts_eos_when_history_render_is_shorter_than_prefix_render():
    # Reasoning [50, 51] kept in the prefix render, stripped from the full render: positions disagree, counts do not.
    true_prefix = [1, 2, EOS, 3, 50, 51, 5, EOS]
    prefix_render = [1, 2, EOS, 3, 50, 51, 5, EOS, 7]
    full_render = [1, 2, EOS, 3, 5, EOS, 7, 6, EOS, 3]
    assert splice_prompt_ids(true_prefix, prefix_render, full_render, EOS) == [
        1,
        2,
        EOS,
        3,
        50,
        51,
        5,
        EOS,
        7,
        6,
        EOS,
        3,
    ]


def test_splice_of_generation_cut_at_length_limit_keeps_all_tokens_and_closes_turn_with_template_eos():
    true_prefix = [1, 2, EOS, 3, 4, 4]  # no EOS: cut at max_tokens
    prefix_render = [1, 2, EOS, 3, 4, 4, EOS, 7]
    full_render = [1, 2, EOS, 3, 4, 4, EOS, 7, 8, EOS, 3]
    assert splice_prompt_ids(true_prefix, prefix_render, full_render, EOS) == [1, 2, EOS, 3, 4, 4, EOS, 7, 8, EOS, 3]


def test_splice_of_generation_ended_on_other_stop_token_keeps_that_token_before_template_eos():
    other_stop = 8
    true_prefix = [1, 2, EOS, 3, 4, other_stop]
    prefix_render = [1, 2, EOS, 3, 4, EOS, 7]
    full_render = [1, 2, EOS, 3, 4, EOS, 7, 6, EOS, 3]
    assert splice_prompt_ids(true_prefix, prefix_render, full_render, EOS) == [1, 2, EOS, 3, 4, 8, EOS, 7, 6, EOS, 3]


def test_splice_of_empty_generation_is_prompt_then_template_close():
    assert splice_prompt_ids([1, EOS, 3], [1, EOS, 3, EOS, 7], [1, EOS, 3, EOS, 7, 6, EOS, 3], EOS) == [
        1,
        EOS,
        3,
        EOS,
        7,
        6,
        EOS,
        3,
    ]


def test_splice_refuses_prefix_render_without_eos_naming_rule_1():
    with pytest.raises(SpliceError, match=r"rule 1 .*contains no EOS token 9"):
        splice_prompt_ids([1, 2, EOS], [1, 2, 3], [1, 2, 3, 4], EOS)


def test_splice_refuses_truncated_history_naming_rule_2_and_both_counts():
    true_prefix = [1, EOS, 2, EOS, 3, EOS, 4, EOS]  # the model saw three earlier turns
    prefix_render = [3, EOS, 4, EOS, 7]  # the agent dropped two of them
    with pytest.raises(SpliceError, match=r"rule 2 .*hold 4 EOS.*holds 2"):
        splice_prompt_ids(true_prefix, prefix_render, prefix_render + [6, EOS], EOS)


def test_splice_refuses_full_render_with_fewer_eos_naming_rule_3():
    with pytest.raises(SpliceError, match=r"rule 3 .*holds 1 EOS token\(s\), fewer than the 2"):
        splice_prompt_ids([1, EOS, 2, EOS], [1, EOS, 2, EOS], [1, EOS, 2], EOS)


def test_splice_error_is_a_value_error_and_never_reads_as_a_length_finish():
    # NeMo Gym's model server turns a 400 mentioning "context length" or "max_tokens" into a silent length
    # finish; a refusal must fail the episode instead.
    with pytest.raises(ValueError) as info:
        splice_prompt_ids([1, EOS, 2, EOS, 3, EOS], [1, EOS, 7], [1, EOS, 7, 8], EOS)
    assert "context length" not in str(info.value) and "max_tokens" not in str(info.value)


def test_splice_with_eos_count_gives_the_output_of_the_prefix_render_it_counts():
    # The first example above, with N = 2 given instead of the prefix render [1, 2, EOS, 3, 5, EOS, 7].
    true_prefix = [1, 2, EOS, 3, 4, EOS]
    full_render = [1, 2, EOS, 3, 5, EOS, 7, 8, EOS, 3]
    assert splice_with_eos_count(true_prefix, 2, full_render, EOS) == [1, 2, EOS, 3, 4, EOS, 7, 8, EOS, 3]


def test_splice_with_eos_count_refuses_a_count_of_zero_naming_rule_1():
    with pytest.raises(SpliceError, match=r"rule 1 .*contains no EOS token 9"):
        splice_with_eos_count([1, 2, EOS], 0, [1, 2, 3, 4], EOS)


def test_splice_with_eos_count_refuses_a_count_the_true_prefix_does_not_hold_naming_rule_2():
    with pytest.raises(SpliceError, match=r"rule 2 .*hold 2 EOS.*holds 3"):
        splice_with_eos_count([1, EOS, 2, EOS], 3, [1, EOS, 2, EOS, 3, EOS, 4], EOS)


# -- N counted on the prefix render's text ----------------------------------------------------------------------

EOS_TEXT = "<e>"  # the text of EOS token 9 in these tests


def test_count_eos_in_text_counts_the_eos_text_when_the_full_render_text_and_ids_agree():
    full_text, full_ids = "<e>a<e>c<e>d", [9, 1, 9, 2, 9, 3]
    assert count_eos_in_text("<e>a<e>bb<e>", full_text, full_ids, EOS_TEXT, EOS) == 3


def test_count_eos_in_text_counts_zero_when_neither_render_holds_eos():
    assert count_eos_in_text("ab", "abc", [1, 2, 3], EOS_TEXT, EOS) == 0


def test_count_eos_in_text_distrusts_a_full_render_whose_text_holds_more_eos_text_than_its_ids_hold_eos():
    # One "<e>" of the text did not tokenize to EOS (e.g. a tokenizer that splits special tokens).
    assert count_eos_in_text("<e>a<e>b<e>", "<e>a<e>c<e>d", [9, 1, 4, 5, 2, 9, 3], EOS_TEXT, EOS) is None


def test_count_eos_in_text_distrusts_a_full_render_whose_ids_hold_an_eos_its_text_does_not_show():
    # EOS came from text other than "<e>" (e.g. EOS is an ordinary token that also appears inside merges).
    assert count_eos_in_text("a<e>b", "a</s>c", [1, 9, 3], EOS_TEXT, EOS) is None


def test_count_eos_in_text_distrusts_an_empty_eos_text():
    assert count_eos_in_text("ab", "abc", [1, 2, 3], "", EOS) is None


def _assistant(prompt, generation, **extra):
    return {
        "role": "assistant",
        "content": "x",
        "prompt_token_ids": prompt,
        "generation_token_ids": generation,
        **extra,
    }


def test_find_true_prefix_without_token_ids_is_none():
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    assert not has_token_ids(messages)
    assert find_true_prefix(messages) is None


def test_find_true_prefix_takes_last_carrier_and_converts_decimal_strings():
    messages = [
        {"role": "user", "content": "a"},
        _assistant([1], [2, EOS]),
        {"role": "user", "content": "b"},
        _assistant([1, 2, EOS, 3], ["151667", 9], generation_log_probs=[-0.5, -0.1]),
        {"role": "user", "content": "c"},
    ]
    assert has_token_ids(messages)
    assert find_true_prefix(messages) == TruePrefix(
        3, [1, 2, EOS, 3], [151667, 9], (Generation(1, 1, 3), Generation(3, 4, 6))
    )
    assert find_true_prefix(messages).token_ids == [1, 2, EOS, 3, 151667, 9]


def test_find_true_prefix_refuses_ids_on_a_user_message():
    with pytest.raises(SpliceError, match=r"messages\[0\] carries token IDs but has role 'user'"):
        find_true_prefix([{"role": "user", "content": "a", "prompt_token_ids": [1], "generation_token_ids": [2]}])


def test_find_true_prefix_refuses_missing_generation_ids():
    with pytest.raises(SpliceError, match=r"messages\[1\] .* no 'generation_token_ids'"):
        find_true_prefix([{"role": "user", "content": "a"}, {"role": "assistant", "prompt_token_ids": [1]}])


@pytest.mark.parametrize("bad", [[1, "x"], [1, 2.0], [1, None], [1, -3], [True]])
def test_find_true_prefix_refuses_values_that_are_not_token_ids(bad):
    with pytest.raises(SpliceError, match=r"messages\[0\]\.generation_token_ids\[\d\]"):
        find_true_prefix([_assistant([1], bad)])


def test_find_true_prefix_refuses_non_list_ids():
    with pytest.raises(SpliceError, match=r"messages\[0\]\.prompt_token_ids must be a list of token IDs, got str"):
        find_true_prefix([_assistant("1 2 3", [4])])


def test_find_true_prefix_refuses_generation_split_over_two_assistant_messages():
    messages = [{"role": "user", "content": "a"}, _assistant([1], [2, EOS]), {"role": "assistant", "content": "b"}]
    with pytest.raises(SpliceError, match=r"one message per generation.*messages\[2\].*messages\[1\]"):
        find_true_prefix(messages)


# -- malformed carriers -------------------------------------------------------------------------------------------


def test_find_true_prefix_refuses_empty_id_lists_naming_the_message():
    messages = [{"role": "user", "content": "a"}, _assistant([], []), {"role": "user", "content": "b"}]
    with pytest.raises(SpliceError, match=r"messages\[1\]\.prompt_token_ids is empty"):
        find_true_prefix(messages)


def test_find_true_prefix_refuses_log_probs_that_do_not_match_the_generation_naming_the_message():
    message = _assistant([1], [2, EOS], generation_log_probs=[-0.1])
    with pytest.raises(SpliceError, match=r"messages\[1\] carries 2 generation_token_ids but 1 generation_log_probs"):
        find_true_prefix([{"role": "user", "content": "a"}, message])


def test_find_true_prefix_refuses_an_earlier_carrier_missing_its_generation_ids():
    partial = {"role": "assistant", "content": "x", "prompt_token_ids": [1]}
    messages = [partial, {"role": "user", "content": "b"}, _assistant([1, 2, EOS, 3], [4, EOS])]
    with pytest.raises(SpliceError, match=r"messages\[0\] carries token IDs but has no 'generation_token_ids'"):
        find_true_prefix(messages)


def test_find_true_prefix_refuses_carriers_whose_ids_are_not_one_conversation_naming_both():
    messages = [
        {"role": "user", "content": "a"},
        _assistant([1], [5, EOS]),  # the later prompt holds [2, EOS] where this generation should be
        {"role": "user", "content": "b"},
        _assistant([1, 2, EOS, 3], [4, EOS]),
    ]
    with pytest.raises(SpliceError, match=r"messages\[1\] and messages\[3\] carry mismatched token IDs"):
        find_true_prefix(messages)


# -- rule 4: the history's template text is what the model saw -----------------------------------------------------
# Token IDs stand for text through DECODE; 20-29 are template text, 50-59 the model's generations.

TEXT = {EOS: "<e>", 20: "<sys>", 21: "Be terse.", 22: "Be verbose.", 23: "<user>", 24: "hi", 25: "ok", 26: "<bot>"}
TEXT |= {27: "[redacted]", 28: "<think>", 50: "Hello", 51: "Sure", 52: "Bye"}


def decode(ids):
    return "".join(TEXT[t] for t in ids)


def no_prompt():
    raise AssertionError("the generation prompt is read only when the IDs differ")


def _two_turn(system=21, user=24):
    """System, user, model turn, user, model turn; the true prefix of the second model turn."""
    prompt1 = [20, system, EOS, 23, user, EOS, 26]
    gen1 = [50, EOS]
    prompt2 = prompt1 + gen1 + [23, 25, EOS, 26]
    gen2 = [51, EOS]
    messages = [
        {"role": "system", "content": TEXT[system]},
        {"role": "user", "content": TEXT[user]},
        _assistant(prompt1, gen1),
        {"role": "user", "content": "ok"},
        _assistant(prompt2, gen2),
        {"role": "user", "content": "ok"},
    ]
    return messages


def test_rule_4_accepts_an_unedited_history_comparing_ids_only():
    messages = _two_turn()
    full = [20, 21, EOS, 23, 24, EOS, 26, 50, EOS, 23, 25, EOS, 26, 51, EOS, 23, 25, EOS, 26]
    check_unedited_history(find_true_prefix(messages), full, EOS, decode, no_prompt, messages)


def _pre_written_history():
    """calendar's shape (NeMo Gym 0.7): a history with an assistant turn the policy never generated (no token IDs),
    then the policy's own turn (a carrier) and the next user message. Token 52 is the pre-written reply."""
    prompt = [20, 21, EOS, 23, 24, EOS, 26, 52, EOS, 23, 25, EOS, 26]  # system, user, pre-written reply, user
    generation = [50, EOS]
    messages = [
        {"role": "system", "content": TEXT[21]},
        {"role": "user", "content": TEXT[24]},
        {"role": "assistant", "content": TEXT[52]},  # written into the row, never generated
        {"role": "user", "content": TEXT[25]},
        _assistant(prompt, generation),
        {"role": "user", "content": TEXT[25]},
    ]
    full = [*prompt, 50, EOS, 23, 25, EOS, 26]
    return messages, prompt, full


def test_a_pre_written_assistant_turn_is_template_text_of_the_prompt_never_a_generation():
    messages, prompt, full = _pre_written_history()
    true_prefix = find_true_prefix(messages)
    # Only the policy's own turn is a generation; the pre-written reply is part of that turn's prompt.
    assert true_prefix.generations == (Generation(4, len(prompt), len(prompt) + 2),)
    spliced = check_and_splice(true_prefix, 5, full, EOS, decode, no_prompt, messages)
    assert spliced == full
    # The pre-written reply keeps the template's tokens (52), before the first generation: packing makes every
    # token before the first generation the episode's prompt (response_mask 0).
    assert spliced.index(52) < true_prefix.generations[0].start


def test_rule_4_refuses_a_pre_written_assistant_turn_edited_after_the_policy_saw_it():
    messages, _, full = _pre_written_history()
    messages[2] = {"role": "assistant", "content": TEXT[51]}
    edited = [token if token != 52 else 51 for token in full]
    with pytest.raises(EditedHistory, match=r"rule 4 .*first edited message: messages\[2\] ") as e:
        check_unedited_history(
            find_true_prefix(messages), edited, EOS, decode, lambda: GenerationPrompt("", ""), messages
        )
    assert e.value.edited == (2, "assistant")


def test_rule_4_refuses_a_system_prompt_changed_between_turns_naming_it():
    messages = _two_turn()
    messages[0] = {"role": "system", "content": "Be verbose."}
    full = [20, 22, EOS, 23, 24, EOS, 26, 50, EOS, 23, 25, EOS, 26, 51, EOS, 23, 25, EOS, 26]  # same EOS count
    with pytest.raises(EditedHistory, match=r"rule 4 .*messages\[2\].*first edited message: messages\[0\] ") as e:
        check_unedited_history(
            find_true_prefix(messages), full, EOS, decode, lambda: GenerationPrompt("", ""), messages
        )
    assert isinstance(e.value, SpliceError) and e.value.edited == (0, "system")


def test_rule_4_refuses_an_earlier_user_message_redacted_naming_it_and_showing_both_texts():
    messages = _two_turn()
    messages[1] = {"role": "user", "content": "[redacted]"}
    full = [20, 21, EOS, 23, 27, EOS, 26, 50, EOS, 23, 25, EOS, 26, 51, EOS, 23, 25, EOS, 26]
    with pytest.raises(
        SpliceError, match=r"messages\[1\] \(role 'user'\).*'<sys>Be terse.<e><user>hi.*<user>\[redacted\]"
    ):
        check_unedited_history(
            find_true_prefix(messages), full, EOS, decode, lambda: GenerationPrompt("", ""), messages
        )


def test_rule_4_refuses_a_hoisted_system_message_added_after_a_model_turn():
    # A DeepSeek-style template renders every system message at the head, so a system message appended after
    # the second model turn changes text the model saw before its first turn.
    messages = _two_turn() + [{"role": "system", "content": "Be verbose."}]
    full = [20, 21, 22, EOS, 23, 24, EOS, 26, 50, EOS, 23, 25, EOS, 26, 51, EOS, 23, 25, EOS, 26]
    with pytest.raises(SpliceError, match=r"first edited message: messages\[6\] \(role 'system'\)"):
        check_unedited_history(
            find_true_prefix(messages), full, EOS, decode, lambda: GenerationPrompt("", ""), messages
        )


def test_rule_4_refuses_changed_template_text_in_no_message_as_changed_tools():
    messages = _two_turn()
    full = [20, 21, 28, EOS, 23, 24, EOS, 26, 50, EOS, 23, 25, EOS, 26, 51, EOS, 23, 25, EOS, 26]
    with pytest.raises(SpliceError, match=r"no message text between messages\[0\] and messages\[2\] differs"):
        check_unedited_history(
            find_true_prefix(messages), full, EOS, decode, lambda: GenerationPrompt("", ""), messages
        )


def test_rule_4_accepts_a_generation_prompt_that_opens_reasoning_the_history_does_not_show():
    # The generation prompt is `<bot><think>`, the history writes only `<bot>` before an assistant message.
    prompt1 = [20, 21, EOS, 23, 24, EOS, 26, 28]
    gen1 = [50, EOS]
    messages = [
        {"role": "system", "content": "Be terse."},
        {"role": "user", "content": "hi"},
        _assistant(prompt1, gen1),
        {"role": "user", "content": "ok"},
    ]
    full = [20, 21, EOS, 23, 24, EOS, 26, 50, EOS, 23, 25, EOS, 26, 28]
    check_unedited_history(
        find_true_prefix(messages), full, EOS, decode, lambda: GenerationPrompt("<bot><think>", "<bot>"), messages
    )


def test_rule_4_refuses_text_appended_to_a_user_message_just_before_a_reasoning_generation_prompt():
    prompt1 = [20, 21, EOS, 23, 24, 26, 28]  # a template whose user turns do not end with EOS
    messages = [
        {"role": "system", "content": "Be terse."},
        {"role": "user", "content": "hiok"},
        _assistant(prompt1, [50, EOS]),
        {"role": "user", "content": "ok"},
    ]
    full = [20, 21, EOS, 23, 24, 25, 26, 50, EOS, 23, 25, 26, 28]
    with pytest.raises(SpliceError, match=r"rule 4 .*first edited message: messages\[1\]"):
        check_unedited_history(
            find_true_prefix(messages), full, EOS, decode, lambda: GenerationPrompt("<bot><think>", "<bot>"), messages
        )


# -- the turn terminator and generation prompt from probe renders -----------------------------------------------


def test_read_generation_prompt_splits_the_reasoning_opening_from_the_shared_header():
    from recipe.nemo_gym.splice.template_probe import PROBE_ASSISTANT as A
    from recipe.nemo_gym.splice.template_probe import PROBE_USER as Q

    renders = ProbeRenders(
        f"<u>{Q}", f"<u>{Q}<A><think>\n", f"<u>{Q}<A><think></think>{A}<e>", f"<u>{Q}<A>{A}<e><u>{Q}"
    )
    prompt = read_generation_prompt(renders)
    assert prompt == GenerationPrompt("<A><think>\n", "<A>") and prompt.unshared == "<think>\n"


def test_read_generation_prompt_reads_after_the_user_message_where_the_template_ignores_the_flag():
    from recipe.nemo_gym.splice.template_probe import PROBE_ASSISTANT as A
    from recipe.nemo_gym.splice.template_probe import PROBE_USER as Q

    # Both [user] renders end with the generation prompt (vLLM's DeepSeek-V4 encoder ignores the flag).
    renders = ProbeRenders(f"<u>{Q}<A><t>", f"<u>{Q}<A><t>", "", f"<u>{Q}<A></t>{A}<e><u>{Q}<A><t>")
    assert read_generation_prompt(renders).unshared == "t>"  # read per character: `<t>` and `</t>` share `<`


def test_read_generation_prompt_is_empty_when_the_probe_text_is_missing():
    assert read_generation_prompt(ProbeRenders("", "<A>", "", "")) == GenerationPrompt("", "")


def test_text_after_assistant_is_what_follows_the_probe_answer():
    from recipe.nemo_gym.splice.template_probe import PROBE_ASSISTANT

    renders = ProbeRenders("", "", f"<u>q<A>{PROBE_ASSISTANT}<end>\n", "")
    assert text_after_assistant(renders) == "<end>\n"


def test_turn_terminator_is_the_first_special_token_after_the_assistant_content():
    assert turn_terminator([198, 7, 151645, 198], {151645, 151643}) == 151645


def test_turn_terminator_is_none_for_a_template_that_writes_no_special_token_after_the_content():
    assert turn_terminator([198], {151645}) is None
    assert turn_terminator([], {151645}) is None


def test_hoisted_system_message_holding_the_eos_text_is_refused_not_cut_one_turn_early():
    # The hoisted message adds an EOS at the head: rules 1 to 3 pass (the prefix render, without it, holds 5)
    # and the 5th EOS of the full render closes the first model turn, not the second; rule 4 refuses.
    messages = _two_turn() + [{"role": "system", "content": "Be verbose.<e>"}]
    full = [20, 21, 22, EOS, EOS, 23, 24, EOS, 26, 50, EOS, 23, 25, EOS, 26, 51, EOS, 23, 25, EOS, 26]
    tp = find_true_prefix(messages)
    assert splice_with_eos_count(tp.token_ids, 5, full, EOS)[-8:] == [EOS, 26, 51, EOS, 23, 25, EOS, 26]
    with pytest.raises(SpliceError, match=r"first edited message: messages\[6\] \(role 'system'\)"):
        check_and_splice(tp, 5, full, EOS, decode, lambda: GenerationPrompt("", ""), messages)
