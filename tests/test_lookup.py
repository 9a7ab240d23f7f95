"""Prompt-lookup drafter: hand-worked histories first, then properties of find_draft on random histories."""

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tinyspec.lookup import LookupDrafter, find_draft
from tinyspec.sampling import SamplingParams
from tinyspec.drafting import Draft


# --------------------------------------------------------------------------------- hand-worked histories


def test_docstring_example():
    # suffix [8 5 6] never seen; suffix [5 6] at i=4 and i=0, the most recent (4) wins -> h[6:9]
    assert find_draft([5, 6, 7, 9, 5, 6, 7, 8, 5, 6], k=3, n_max=3) == [7, 8, 5]


def test_most_recent_occurrence_wins():
    # [1] occurs at 0 (followed by 2 3) and at 3 (followed by 4 5): the later one is used
    assert find_draft([1, 2, 3, 1, 4, 5, 1], k=2, n_max=1) == [4, 5]


def test_longest_n_wins_over_shorter_more_recent_match():
    # 2-gram [7 8] only at i=0 (-> 10 11); the 1-gram [8] is more recent at i=4 (-> 20 21). n=2 is tried first.
    history = [7, 8, 10, 11, 8, 20, 21, 7, 8]
    assert find_draft(history, k=2, n_max=2) == [10, 11]
    assert find_draft(history, k=2, n_max=1) == [20, 21]


def test_n_min_forbids_short_matches():
    history = [7, 8, 10, 11, 8, 20, 21, 9, 8]  # only the 1-gram [8] repeats
    assert find_draft(history, k=2, n_max=3, n_min=1) == [20, 21]
    assert find_draft(history, k=2, n_max=3, n_min=2) == []


def test_no_match_is_empty():
    assert find_draft([1, 2, 3, 4], k=5) == []
    assert find_draft([], k=5) == []
    assert find_draft([9], k=5) == []


def test_k_truncation_and_history_end():
    history = [1, 2, 3, 4, 5, 6, 1, 2]
    assert find_draft(history, k=3) == [3, 4, 5]
    assert find_draft(history, k=0) == []
    assert find_draft(history, k=100) == [3, 4, 5, 6, 1, 2]  # runs to the end of the history
    # overlapping occurrence: in [4 4 4] the suffix [4 4] was last seen at i=0, followed only by the suffix's own 4
    assert find_draft([4, 4, 4], k=5, n_max=2) == [4]


def test_bad_arguments():
    for kw in [{"k": -1}, {"k": 1, "n_min": 0}, {"k": 1, "n_max": 1, "n_min": 2}]:
        with pytest.raises(ValueError):
            find_draft([1, 2, 1], **kw)
    with pytest.raises(ValueError):
        LookupDrafter(n_max=1, n_min=2)


def test_drafter_protocol_keeps_history_equal_to_prompt_plus_fed():
    rng = np.random.default_rng(0)
    params = SamplingParams()
    hidden = lambda n: np.zeros((n, 8), dtype=np.float32)  # ignored by this drafter
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    drafter = LookupDrafter(n_max=3)
    drafter.start(prompt, hidden(len(prompt)), 3)
    assert drafter.history == prompt

    # pending 1 after ... 2 6: suffix [6 1] unseen, [1] last at i=3 -> 5 9 2; the drafts are deterministic
    draft = drafter.propose(1, 3, params, rng)
    assert draft.tokens == [5, 9, 2] and draft.q_rows == [None, None, None]
    assert drafter.history == prompt  # propose does not commit the pending token

    drafter.commit([1, 5], hidden(2))  # pending + one accepted draft
    assert drafter.history == prompt + [1, 5]
    # pending 8: never seen -> a plain step
    assert drafter.propose(8, 3, params, rng) == Draft([], [])
    drafter.commit([8], hidden(1))
    assert drafter.history == prompt + [1, 5, 8]

    drafter.start([7, 7], hidden(2), 3)  # a new generation starts from scratch
    assert drafter.history == [7, 7]


# --------------------------------------------------------------------------------- properties

histories = st.lists(st.integers(0, 3), max_size=40)  # a small alphabet, so n-grams repeat


def brute_force(history, k, n_max, n_min):
    """Every (n, i) where the n-gram at i equals the suffix, i < len - n; the answer is the largest n, then largest i."""
    L = len(history)
    matches = [(n, i) for n in range(n_min, n_max + 1) for i in range(L - n) if history[i:i + n] == history[L - n:]]
    if not matches or k == 0:
        return []
    n, i = max(matches)
    return history[i + n:i + n + k]


@settings(max_examples=300, deadline=None)
@given(histories, st.integers(0, 6), st.integers(1, 5), st.integers(0, 4))
@example([0, 1, 2, 0, 1], 3, 4, 0)
@example([2, 2, 2, 2], 5, 2, 1)
def test_draft_is_a_continuation_of_an_earlier_occurrence(history, k, n_max, n_min_minus):
    n_min = max(1, n_max - n_min_minus)
    draft = find_draft(history, k, n_max, n_min)
    L = len(history)
    assert len(draft) <= k
    if draft:
        # some n in [n_min, n_max] and earlier i (not the suffix itself) whose continuation is the draft
        assert any(history[i:i + n] == history[L - n:] and history[i + n:i + n + k] == draft
                   for n in range(n_min, n_max + 1) for i in range(L - n))
    # and it is exactly the longest n, then the most recent occurrence
    assert draft == brute_force(history, k, n_max, n_min)
