"""tinyspec/textstream.py: TextStream's stop strings, by hand, against a simple reference (hypothesis), and in
linear work however long the stop string."""

from __future__ import annotations

from itertools import pairwise

from hypothesis import example, given, settings
from hypothesis import strategies as st

from tinyspec.textstream import (
    MAX_STOP_CHARS,
    StreamPrinter,
    TextStream,
    failure_function,
    text_ids,
)


class ByteTokens:
    """A tokenizer whose token i is the i-th byte string given: any cut of a text into tokens."""

    def __init__(self, pieces: list[bytes]):
        self.pieces = pieces

    def decode_bytes(self, ids) -> bytes:
        return b"".join(self.pieces[i] for i in ids)


def stream_of(pieces: list[str], stops: tuple[str, ...]) -> tuple[TextStream, list[int]]:
    """A TextStream over tokens that are these text pieces, and the pieces' ids in order."""
    return TextStream(ByteTokens([p.encode() for p in pieces]), stops), list(range(len(pieces)))


def test_failure_function_by_hand():
    assert failure_function("abab") == [0, 0, 0, 1, 2]
    assert failure_function("aab") == [0, 0, 1, 0]
    assert failure_function("aaa") == [0, 0, 1, 2]
    assert MAX_STOP_CHARS == 1000


def test_a_self_overlapping_stop_by_hand():
    """"aaab" with the stop "aab": "aa" could begin it (held), the third "a" shows the first one cannot (released),
    and "b" completes it: the stream ends, its text cut where "aab" began."""
    stream, ids = stream_of(["aa", "a", "b", "zz"], ("aab",))
    assert [stream.feed([i]) for i in ids] == ["", "a", "", ""]
    assert stream.stopped and stream.finish() == ""


def test_of_two_stops_the_one_that_ends_first_wins_and_on_a_tie_the_longer():
    stream, _ = stream_of(["xabcd"], ("abcd", "bc"))
    assert stream.feed([0]) == "xa" and stream.stopped  # "bc" ends before "abcd"
    stream, _ = stream_of(["xabc"], ("bc", "abc"))
    assert stream.feed([0]) == "x" and stream.stopped  # both end at "c": "abc" begins first


@settings(max_examples=300, deadline=None)
@given(text=st.text(alphabet="ab€ \n", max_size=30),
       stops=st.lists(st.one_of(st.sampled_from(["aab", "abab", "aaa"]), st.text(alphabet="ab€", min_size=1,
                                                                                 max_size=4)), max_size=3),
       cuts=st.lists(st.integers(0, 100), max_size=12), runs=st.lists(st.integers(1, 3), max_size=12))
@example(text="aaab", stops=["aab"], cuts=[1, 2, 3], runs=[1, 1, 1]).via("a self-overlapping stop")
@example(text="ababab", stops=["abab", "aaa"], cuts=[1, 2, 3, 4, 5], runs=[1]).via("a stop within a stop")
def test_text_stream_releases_the_text_cut_at_the_first_stop_however_it_is_split(text, stops, cuts, runs):
    """Tokens cut the UTF-8 bytes anywhere (inside a character too) and arrive in runs of 1..3 tokens, as verify
    steps emit them; what the stream releases, joined, is the text up to where the first stop string to be
    completed begins (as if it came one character at a time), and no released piece is ever taken back.
    (The same property as tests/test_serve.py's for serve.TextStream, whose reference this is.)"""
    data = text.encode()
    bounds = sorted({0, len(data), *(c % (len(data) + 1) for c in cuts)})
    pieces = [data[a:b] for a, b in pairwise(bounds)]
    stream = TextStream(ByteTokens(pieces), tuple(stops))
    ids, out, i = list(range(len(pieces))), [], 0
    for n in runs + [len(ids)]:
        out.append(stream.feed(ids[i : i + n]))
        i += n
    out.append(stream.finish())
    ends = [(i + len(s), i) for s, i in ((s, text.find(s)) for s in stops) if i >= 0]  # the first one completed
    first = min(ends)[1] if ends else len(text)
    assert "".join(out) == text[:first]
    assert stream.stopped == (first < len(text))


def test_a_100k_character_stop_string_costs_work_linear_in_the_text():
    """The bug: serve.TextStream found the held-back tail by testing text.endswith(stop[:n]) for every n below
    the stop's length on every step, O(L^2) character compares a step: a 300 KB stop string stalled the
    server's engine thread for 10-28 s. Here a 100,000-character stop "a...ab", the worst case for matching
    prefixes (every "a" extends one), meets 150,000 "a"s then "b", in 2,000 pieces: the automaton moves (counted
    by the stream, not timed) stay within a small multiple of the characters fed plus the stop's length, the
    text kept is never more than the held-back tail, and the text released is cut where the stop begins."""
    stop = "a" * 99_999 + "b"
    text = "a" * 150_000 + "b" + "after the stop"
    pieces = [text[len(text) * i // 2_000 : len(text) * (i + 1) // 2_000] for i in range(2_000)]
    stream, ids = stream_of(pieces, (stop,))
    out = []
    for i in ids:
        out.append(stream.feed([i]))
        assert stream.n_held < len(stop)  # only the text that could still begin the stop is kept
    out.append(stream.finish())
    assert "".join(out) == "a" * (150_001 - len(stop)) and stream.stopped
    assert stream.steps <= 3 * (len(text) + len(stop))


def test_text_ids_leave_out_a_final_stop_id_only():
    """The end-of-generation token ends a sequence: its text is not shown, its id is still counted elsewhere."""
    assert text_ids([5, 6, 9], (9,)) == [5, 6] and text_ids([9], (9,)) == [] and text_ids([], (9,)) == []
    assert text_ids([9, 5], (9,)) == [9, 5] and text_ids([5, 9], ()) == [5, 9]


def test_stream_printer_prints_no_stop_text():
    import io

    out = io.StringIO()
    printer = StreamPrinter(ByteTokens([b"ab", b"\xc3", b"\xa9", b"<|endoftext|>"]), stop_ids=(3,), out=out)
    printer([0, 1], ["target", "accepted"])
    printer([2, 3], ["accepted", "bonus"])
    printer.close()
    assert out.getvalue() == "ab\u00e9\n"
