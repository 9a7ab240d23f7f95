"""Token ids to text as they are decided: an incremental UTF-8 decoder over the tokens' bytes.

A byte-level BPE token stands for bytes, not characters: "é" is c3 a9, and one token may end with c3 while
the next begins with a9. Decoding each token on its own would print two U+FFFD for one character. TokenText
keeps the bytes of an unfinished character until its last byte arrives, so the pieces it hands out, joined,
are exactly tokenizer.decode(every token) (both replace bytes that are not UTF-8 with U+FFFD):

    feed([t1])  -> "ab"      t1 = b"ab\\xc3"   (\\xc3 waits: a character begins there)
    feed([t2])  -> "é!"      t2 = b"\\xa9!"
    finish()    -> ""        (bytes still waiting at the end: U+FFFD each)

Used by `generate --stream` (StreamPrinter, below) and by the HTTP server, whose serve.TextStream adds what only
a server needs: text held back while it could be the start of a stop string.
"""

from __future__ import annotations

import codecs
import sys


class TokenText:
    """Token ids in, text out, piece by piece: feed() what was decided, finish() once at the end."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer  # anything with decode_bytes(ids) -> bytes (tokenizer.Tokenizer)
        self.utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, tokens: list[int]) -> str:
        return self.utf8.decode(self.tokenizer.decode_bytes(tokens))

    def finish(self) -> str:
        return self.utf8.decode(b"", final=True)


class StreamPrinter:
    """on_emit for generate(): writes tokens to `out` (standard output) as they are decided, so the stream
    equals the final text; close() ends it with a newline, as print(text) would."""

    def __init__(self, tokenizer, out=None):
        self.text, self.out = TokenText(tokenizer), out

    def __call__(self, tokens: list[int], marks: list[str]) -> None:
        self._write(self.text.feed(tokens))

    def close(self) -> None:
        self._write(self.text.finish() + "\n")

    def _write(self, text: str) -> None:
        out = self.out or sys.stdout  # looked up when written: a test may have swapped sys.stdout since
        out.write(text)
        out.flush()
