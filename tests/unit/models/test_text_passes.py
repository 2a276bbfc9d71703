"""The text models' batching rule: which texts share a pass, checked against every possible plan."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from workerpool.models.text_passes import MAX_ROWS, PADDING_SHARE, PASS_TOKENS, plan_passes

OVERHEAD = 8.0
lengths_of_texts = st.lists(st.integers(min_value=0, max_value=300), min_size=1, max_size=60)


def padding(lengths: list[int], group: list[int]) -> tuple[int, int]:
    """The padding tokens a pass over ``group`` adds, and its real tokens (an empty text is
    padded to one token)."""
    sizes = [max(1, lengths[i]) for i in group]
    return len(sizes) * max(sizes) - sum(sizes), sum(sizes)


def cost(lengths: list[int], passes: list[list[int]]) -> float:
    return sum(OVERHEAD + len(group) * max(max(1, lengths[i]) for i in group) for group in passes)


def allowed(lengths: list[int], group: list[int]) -> bool:
    padded, real = padding(lengths, group)
    return len(group) == 1 or (padded <= PADDING_SHARE * real and padded + real <= PASS_TOKENS)


@given(lengths_of_texts)
def test_every_text_runs_once_and_no_pass_pads_past_the_bound(lengths):
    passes = plan_passes(lengths, OVERHEAD)
    assert sorted(i for group in passes for i in group) == list(range(len(lengths)))
    for group in passes:
        assert allowed(lengths, group)
        assert len(group) <= MAX_ROWS


@given(lengths_of_texts)
def test_passes_run_in_the_order_of_their_first_text(lengths):
    firsts = [min(group) for group in plan_passes(lengths, OVERHEAD)]
    assert firsts == sorted(firsts)


@given(st.lists(st.integers(min_value=0, max_value=120), min_size=1, max_size=7))
def test_no_other_plan_of_allowed_passes_costs_less(lengths):
    """Every way to cut the sorted texts into runs of neighbours, as brute force."""
    order = sorted(range(len(lengths)), key=lengths.__getitem__)
    least = float("inf")
    for cuts in itertools.product([False, True], repeat=len(order) - 1):
        groups, start = [], 0
        for at, cut in enumerate(cuts, 1):
            if cut:
                groups.append(order[start:at])
                start = at
        groups.append(order[start:])
        if all(allowed(lengths, group) for group in groups):
            least = min(least, cost(lengths, groups))
    assert cost(lengths, plan_passes(lengths, OVERHEAD)) == least


def test_like_lengths_share_a_pass_and_unlike_ones_do_not():
    assert plan_passes([20] * 8, OVERHEAD) == [list(range(8))]
    assert plan_passes([10, 80, 11, 79], OVERHEAD) == [[0, 2], [3, 1]]
    assert plan_passes([80, 10, 79, 11], OVERHEAD) == [[2, 0], [1, 3]]  # the first text's pass first
    assert plan_passes([30, 5], OVERHEAD) == [[0], [1]]  # padding 5 to 30: far past the bound
    assert plan_passes([100, 105], OVERHEAD) == [[0, 1]]  # 5 tokens of padding cost less than a pass
    assert plan_passes([100, 110], OVERHEAD) == [[0], [1]]  # 10 cost more, though within the bound


def test_a_pass_holds_at_most_its_tokens_and_a_longer_text_runs_alone():
    passes = plan_passes([64] * 10 + [300], OVERHEAD)
    assert sorted(len(group) for group in passes) == [1, 2, 4, 4]  # 4 × 64 tokens fill a pass
    assert [10] in passes
