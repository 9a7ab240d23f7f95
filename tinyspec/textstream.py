"""Token ids to text as they are decided: an incremental UTF-8 decoder over the tokens' bytes.

A byte-level BPE token stands for bytes, not characters: "é" is c3 a9, and one token may end with c3 while
the next begins with a9. Decoding each token on its own would print two U+FFFD for one character. TokenText
keeps the bytes of an unfinished character until its last byte arrives, so the pieces it hands out, joined,
are exactly tokenizer.decode(every token) (both replace bytes that are not UTF-8 with U+FFFD):

    feed([t1])  -> "ab"      t1 = b"ab\\xc3"   (\\xc3 waits: a character begins there)
    feed([t2])  -> "é!"      t2 = b"\\xa9!"
    finish()    -> ""        (bytes still waiting at the end: U+FFFD each)

Used by `generate --stream` (StreamPrinter, below) and by the HTTP server, through TextStream (below), which adds
what only a server needs: text held back while it could be the start of a stop string. Which ids have text at
all is text_ids' one rule (a final end-of-generation id has none), for `generate`, `batch` and the demo alike.
"""

from __future__ import annotations

import codecs
import sys
from collections import deque
from collections.abc import Collection, Sequence

MAX_STOP_CHARS = 1000  # characters a stop string may have: the server refuses longer ones (a request names its
# stops; TextStream's work is linear in their length, but its held-back text is not bounded by anything else)


class TokenText:
    """Token ids in, text out, piece by piece: feed() what was decided, finish() once at the end."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer  # anything with decode_bytes(ids) -> bytes (tokenizer.Tokenizer)
        self.utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, tokens: list[int]) -> str:
        return self.utf8.decode(self.tokenizer.decode_bytes(tokens))

    def finish(self) -> str:
        return self.utf8.decode(b"", final=True)


def text_ids(tokens: Sequence[int], stop_ids: Collection[int]) -> list[int]:
    """The ids whose text is shown: all of them but a last one that is a stop id. A sequence that ends at its
    end-of-generation token has that id in its tokens (and in every count of them), but its text, such as
    "<|endoftext|>", is no part of the answer: llama-server and vLLM leave it out too. A stop id only ever comes
    last (generation ends there), in the whole sequence and in the run of tokens a step emits, so this applies
    to both: `generate` prints text_ids(result.tokens, ...), `generate --stream` each run's."""
    tokens = list(tokens)
    return tokens[:-1] if tokens and tokens[-1] in stop_ids else tokens


class StreamPrinter:
    """on_emit for generate(): writes tokens to `out` (standard output) as they are decided, so the stream
    equals the final text (text_ids: a stop id's text is not shown); close() ends it with a newline, as
    print(text) would."""

    def __init__(self, tokenizer, stop_ids: Collection[int] = (), out=None):
        self.text, self.stop_ids, self.out = TokenText(tokenizer), stop_ids, out

    def __call__(self, tokens: list[int], marks: list[str]) -> None:
        self._write(self.text.feed(text_ids(tokens, self.stop_ids)))

    def close(self) -> None:
        self._write(self.text.finish() + "\n")

    def _write(self, text: str) -> None:
        out = self.out or sys.stdout  # looked up when written: a test may have swapped sys.stdout since
        out.write(text)
        out.flush()


def failure_function(stop: str) -> list[int]:
    """Knuth-Morris-Pratt's table for one stop string: fail[j] = the length of the longest proper prefix of
    stop[:j] that is also a suffix of it (j = 1..len(stop); fail[0] is unused). O(len(stop)).

    failure_function("abab") -> [0, 0, 0, 1, 2]        failure_function("aab") -> [0, 0, 1, 0]
    """
    fail, k = [0] * (len(stop) + 1), 0
    for j in range(1, len(stop)):
        while k and stop[j] != stop[k]:
            k = fail[k]
        if stop[j] == stop[k]:
            k += 1
        fail[j + 1] = k
    return fail


class TextStream:
    """Token ids in, final text out: UTF-8 decoded incrementally (TokenText), held back while its end could begin
    a stop string, and cut where the first stop string to be completed begins (`stopped`: then nothing more
    comes out). The stop met first is the one that ENDS first (generation stops there, whatever the run sizes);
    of two that end at the same character, the longer one (it begins first).

    One Knuth-Morris-Pratt automaton per stop string s reads the text a character at a time. Its state is

        state(s) = max { n < len(s) : the text so far ends with s[:n] }

    and a character c moves it to n + 1 if s[n] == c, else it falls back along the failure function
    (n <- fail[n], the next shorter prefix that is also a suffix) and tries again. It reaches len(s) exactly
    where s first ends. The text that could still begin a stop string is the last max_s state(s) characters:
    held back; everything before it is released. Each fall-back shortens the state by one or more and each
    character lengthens it by at most one, so the fall-backs never outnumber the characters: the work is
    O(characters fed x stops + total stop length), where searching the text for every prefix of every stop at
    every step (serve.TextStream before this one) is O(stop length^2) a step. Only the held-back text is kept.
    `steps` counts the automaton moves (tests/test_textstream.py checks it is linear).
    """

    def __init__(self, tokenizer, stops: tuple[str, ...]):
        self.decoded, self.stops = TokenText(tokenizer), tuple(stops)
        self.fail = [failure_function(s) for s in self.stops]
        self.steps = sum(len(s) for s in self.stops)  # building the failure functions: O(their length)
        self.state = [0] * len(self.stops)  # per stop: the longest prefix of it that the text ends with
        self.held: deque[str] = deque()  # the unreleased text in pieces, the first one from self.head on
        self.head = 0
        self.n_held = 0  # characters held back
        self.stopped = "" in self.stops  # the empty stop string ends before the first character

    def feed(self, tokens: list[int]) -> str:
        return self._read(self.decoded.feed(tokens), final=False)

    def finish(self) -> str:
        return self._read(self.decoded.finish(), final=True)

    def _read(self, text: str, final: bool) -> str:
        if self.stopped:
            return ""
        for at, c in enumerate(text if self.stops else ""):
            ended = [s for k, s in enumerate(self.stops) if self._step(k, c) == len(s)]
            if ended:  # cut where the longest of the stops that end here begins; drop the rest
                self._hold(text[: at + 1])
                out = self._release(self.n_held - max(map(len, ended)))
                self.held.clear()
                self.n_held, self.stopped = 0, True
                return out
        self._hold(text)
        return self._release(self.n_held - (0 if final else max(self.state, default=0)))

    def _step(self, k: int, c: str) -> int:
        """Move stop k's automaton over character c; its new state."""
        stop, fail, n = self.stops[k], self.fail[k], self.state[k]
        while n and stop[n] != c:
            n = fail[n]
            self.steps += 1
        if stop[n] == c:
            n += 1
        self.steps += 1
        self.state[k] = n
        return n

    def _hold(self, text: str) -> None:
        if text:
            self.held.append(text)
            self.n_held += len(text)

    def _release(self, n: int) -> str:
        """The first n held characters, taken out. A piece is only sliced for what leaves it (self.head moves),
        so each character is copied once however long it waits."""
        out = []
        self.n_held -= n
        while n > 0:
            piece = self.held[0]
            take = min(n, len(piece) - self.head)
            out.append(piece[self.head : self.head + take])
            self.head += take
            n -= take
            if self.head == len(piece):
                self.held.popleft()
                self.head = 0
        return "".join(out)
