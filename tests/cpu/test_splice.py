"""The pure splice: exact outputs for each rule, and the refusals with their counts (EOS is 9 throughout)."""

import pytest

from recipe.nemo_gym.splice import (
    SpliceError,
    TruePrefix,
    count_eos_in_text,
    find_true_prefix,
    has_token_ids,
    splice_prompt_ids,
    splice_with_eos_count,
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
    assert find_true_prefix(messages) == TruePrefix(3, [1, 2, EOS, 3], [151667, 9])
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
