"""``lockstep bench-judge`` refuses, before any cell, lengths and new tokens that do not fit
the package's context, blaming the one to change: a length past the room the new tokens
leave, or new tokens that leave no room for any prompt."""
from __future__ import annotations

import pytest

from engines.errors import InputError
from harness.judge_bench import bench_judge


def _refusal(lengths, new_tokens) -> InputError:
    with pytest.raises(InputError) as caught:  # tiny_llama: 64 positions
        bench_judge(["native-host"], "tiny_llama", lengths, new_tokens)
    return caught.value


def test_a_length_past_the_room_left_is_blamed_with_the_room():
    err = _refusal([4, 61], 4)
    assert (err.field, err.value) == ("--lengths", 61)
    assert err.remedy.startswith("keep each length within 60")


@pytest.mark.parametrize("lengths, new_tokens, remedy", [
    ([4, 8], 64, "ask for at most 60 --max-new-tokens (for the shortest length, 4)"),
    ([70], 64, "give lengths below 64 and fewer --max-new-tokens"),
])
def test_new_tokens_that_fill_the_context_are_blamed_not_the_lengths(lengths, new_tokens,
                                                                      remedy):
    err = _refusal(lengths, new_tokens)
    assert (err.field, err.value, err.remedy) == ("--max-new-tokens", new_tokens, remedy)
    assert "within 0" not in str(err) and "no prompt length fits" in err.message
