"""The select methods on hand-made logprobs."""

from braid.interpreter.choices import (
    greedy,
    token_length_normalized,
    unconditional_likelihood_normalized,
)


def test_token_length_normalized_is_the_mean():
    assert token_length_normalized([[-1.0, -3.0], [-2.5]]) == [-2.0, -2.5]


def test_greedy_follows_the_most_likely_token_at_each_position():
    # Position 0 ties choices 0 and 1 (choice 2 is worse); position 1 prefers choice 1.
    logprobs = [[-0.5, -2.0], [-0.5, -0.1, -9.0], [-1.0]]
    assert greedy(logprobs) == [0.0, 1.0, 0.0]


def test_greedy_drops_a_choice_that_ends_while_others_go_on():
    assert greedy([[-0.2], [-0.2, -5.0]]) == [0.0, 1.0]


def test_unconditional_normalization_rewards_what_the_context_adds():
    # Choice 0 is likelier in context, but choice 1 gains more over its prior.
    conditional = [[-1.0], [-2.0, -2.0]]
    unconditional = [[-1.5], [-6.0, -6.0]]
    assert unconditional_likelihood_normalized(conditional, unconditional) == [0.5, 4.0]
