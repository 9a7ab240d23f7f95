"""Byte-level BPE tokenizer read from GGUF metadata (tokenizer.ggml.model = "gpt2"), as llama.cpp runs it.

encode(text) takes four steps:
  1. special tokens: cut the text at every USER_DEFINED token text, and at every CONTROL token text
     when allow_special; the longest token text is cut out first.
         "<|im_start|>user\\nhi"  ->  [248045, "user\\nhi"]
  2. pre-tokenize each remaining piece with the regex(es) that tokenizer.ggml.pre names.
         "user\\nhi"  ->  ["user", "\\n", "hi"]
  3. byte-level: write each pre-token's UTF-8 bytes as printable characters (GPT-2's byte table).
         " hi"  ->  "Ġhi"          "é" = b"\\xc3\\xa9"  ->  "Ã©"
  4. BPE: start from single characters and merge the adjacent pair with the lowest merge rank
     (leftmost on a tie) until no adjacent pair is in the merges; then look each part up.
         "Ġhi" -> ["Ġ", "h", "i"] -> ["Ġ", "hi"] -> ["Ġhi"]  (if those merges exist, in that order)
decode(ids) goes back: NORMAL tokens undo step 3, CONTROL / USER_DEFINED / UNKNOWN tokens give their
text, UNUSED tokens (the "[PAD123]" filler) give nothing. Bytes are joined first and turned into a str
once, so a character split across tokens comes back whole.

Official implementation: llama.cpp src/llama-vocab.cpp: tokenizer_st_partition (step 1),
llm_tokenizer_bpe (the regexes), llm_tokenizer_bpe_session::tokenize (steps 3-4), token_to_piece
(decode); src/unicode.cpp: unicode_regex_split (step 2).
Does NOT include: SPM / WordPiece / Unigram vocabularies; pre-tokenizers other than those in
PRE_TOKENIZERS; Unicode normalization (llama.cpp does none, HF's Qwen tokenizer applies NFC first);
the lstrip/rstrip attributes a few other models set on special tokens; llama_detokenize's clean-up of
spaces before punctuation (on for the gpt-2/default pre, off for qwen2/qwen35); adding BOS (callers
prepend bos_id when add_bos is set, as llama_tokenize does when asked to).
Character classes (\\p{L}, \\p{N}, \\p{M}, \\s) come from the `regex` module. Its Unicode is newer than
llama.cpp's table (src/unicode-data.cpp); the two agree on every character assigned by Unicode 14.
"""

from __future__ import annotations

import heapq
from enum import IntEnum
from typing import Any, Iterable, Iterator, Mapping, Sequence

import regex


class TokenType(IntEnum):
    """tokenizer.ggml.token_type values (gguf-py constants.TokenType)."""
    NORMAL = 1
    UNKNOWN = 2
    CONTROL = 3
    USER_DEFINED = 4
    UNUSED = 5
    BYTE = 6


# The regexes, copied from llama.cpp's llm_tokenizer_bpe. Each list is applied in order: every piece
# is split into its matches and the text between them, and both are kept (unicode_regex_split).
# llama.cpp spells the contractions '[sS] rather than (?i:'s): with (?i), "'ſ" (long s) would match too.
CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
QWEN2 = CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
# qwen35 = qwen2 with \p{M} (combining marks) joining the letters: "é" as e + U+0301 stays one word
QWEN35 = (CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
          r"|\s*[\r\n]+|\s+(?!\S)|\s+")
GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
PRE_TOKENIZERS = {
    "qwen35": [QWEN35],
    "qwen2": [QWEN2],
    "gpt-2": [GPT2],
    # llama.cpp's fallback for a BPE vocabulary (also used when tokenizer.ggml.pre is missing)
    "default": [r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"],
}


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> character table: printable bytes stand for themselves, the other 68 bytes
    take chr(256), chr(257), ... in byte order, so every token is a printable string.

    0x21 '!' -> '!'      0x00 -> 'Ā' (U+0100)      0x0A '\\n' -> 'Ċ' (U+010A)      0x20 ' ' -> 'Ġ' (U+0120)
    """
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, n_shifted = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + n_shifted)
            n_shifted += 1
    return table


BYTE_TO_CHAR = bytes_to_unicode()  # int -> str
CHAR_TO_BYTE = {c: b for b, c in BYTE_TO_CHAR.items()}  # str -> int


def split_words(text: str, patterns: Sequence[regex.Pattern]) -> list[str]:
    """Pre-tokenize: split by each pattern in turn, keeping the matches and the gaps between them.

    split_words("Hi  there!", [compiled GPT2]) -> ["Hi", " ", " there", "!"]
    """
    return list(iter_words(text, patterns))


def iter_words(text: str, patterns: Sequence[regex.Pattern]) -> Iterator[str]:
    """split_words one word at a time, in order: each match of the first pattern (and each gap between matches,
    which no alternative matched) split by the others in turn. Lazy, so that encode(limit=) stops a long text
    after the words it needed, not after pre-tokenizing all of it."""
    if not patterns:
        yield text
        return
    end = 0
    for m in patterns[0].finditer(text):
        if m.start() > end:
            yield from iter_words(text[end:m.start()], patterns[1:])  # a gap no alternative matched
        yield from iter_words(m.group(), patterns[1:])
        end = m.end()
    if end < len(text):
        yield from iter_words(text[end:], patterns[1:])


CACHE_WORD_CHARS = 64  # longer pre-tokens are not cached (Tokenizer.encode_word)
CACHE_CHARS = 1_000_000  # the cache is emptied when its words' characters would pass this
CACHE_WORDS = 100_000  # ... or its entries this


class TooManyTokens(ValueError):
    """encode(text, limit=n) found the text has more than n tokens (and stopped there)."""

    def __init__(self, limit: int):
        super().__init__(f"the text has more than {limit} tokens")
        self.limit = limit


# llama.cpp's llama_vocab::impl::load also ends generation at these texts (src/llama-vocab.cpp, special_eog_ids)
EOG_TEXTS = ("<|endoftext|>", "<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end|>", "<end_of_turn>", "<|end_of_text|>")


class Tokenizer:
    """A GGUF's byte-level BPE vocabulary: encode, decode, decode_bytes, token_to_id, id_to_token.

    tok = Tokenizer.from_gguf(read_gguf(path).metadata)
    tok.encode("Hello world")  ->  [9419, 1814]        (the Qwen3.5/3.6 vocabulary)
    tok.decode([9419, 1814])   ->  "Hello world"
    """

    def __init__(self, tokens: Sequence[str], merges: Sequence[str], token_type: Iterable[int] | None = None,
                 pre: str = "default", eos_id: int | None = None, bos_id: int | None = None,
                 pad_id: int | None = None, add_bos: bool = False):
        """tokens: token texts in id order; merges: "left right" strings, best (rank 0) first;
        token_type: a TokenType per token (all NORMAL if None); pre: the tokenizer.ggml.pre value."""
        if pre not in PRE_TOKENIZERS:
            raise ValueError(f"unknown pre-tokenizer {pre!r} (tokenizer.ggml.pre); "
                             f"tinyspec supports {', '.join(map(repr, PRE_TOKENIZERS))}")
        self.tokens = list(tokens)
        self.token_type = [TokenType.NORMAL] * len(self.tokens) if token_type is None else [int(t) for t in token_type]
        if len(self.token_type) != len(self.tokens):
            raise ValueError(f"{len(self.token_type)} token types for {len(self.tokens)} tokens")
        self.vocab = {text: i for i, text in enumerate(self.tokens)}  # str -> int
        if len(self.vocab) != len(self.tokens):  # llama.cpp refuses these files too
            raise ValueError("the token list has duplicate texts")
        self.merge_rank = {}  # (str, str) -> int; the first of duplicate merges wins, as in llama.cpp
        for rank, merge in enumerate(merges):
            space = merge.find(" ", 1)  # split at the first space after the first character, as llama.cpp
            if space > 0:
                self.merge_rank.setdefault((merge[:space], merge[space + 1:]), rank)
        self.pre = pre
        self.patterns = [regex.compile(p) for p in PRE_TOKENIZERS[pre]]
        self.eos_id, self.bos_id, self.pad_id, self.add_bos = eos_id, bos_id, pad_id, add_bos
        # step 1 tables: (text, id), longest text first (llama.cpp's cache_special_tokens order)
        matched = {TokenType.CONTROL, TokenType.USER_DEFINED, TokenType.UNKNOWN}
        special_ids = [i for i, kind in enumerate(self.token_type) if kind in matched and self.tokens[i]]
        special_ids.sort(key=lambda i: -len(self.tokens[i].encode("utf-8")))
        self.specials = [(self.tokens[i], i) for i in special_ids]
        self.user_defined = [(t, i) for t, i in self.specials if self.token_type[i] == TokenType.USER_DEFINED]
        self.cache: dict[str, list[int]] = {}  # pre-token -> ids (encode_word: bounded by characters)
        self.cache_chars = 0  # the characters of the cache's words
        self._max_token_bytes: int | None = None  # max_token_bytes, computed when first asked

    @classmethod
    def from_gguf(cls, metadata: Mapping[str, Any]) -> "Tokenizer":
        """Build from a GGUF's metadata dict (the tokenizer.ggml.* keys)."""
        model = metadata.get("tokenizer.ggml.model")
        if model != "gpt2":
            raise ValueError(f"tokenizer.ggml.model is {model!r}; tinyspec reads only 'gpt2' (byte-level BPE)")
        for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges"):
            if key not in metadata:
                raise ValueError(f"the GGUF has no {key}")

        def get_id(key: str) -> int | None:
            value = metadata.get(f"tokenizer.ggml.{key}")
            return None if value is None else int(value)

        return cls(metadata["tokenizer.ggml.tokens"], metadata["tokenizer.ggml.merges"],
                   metadata.get("tokenizer.ggml.token_type"), metadata.get("tokenizer.ggml.pre") or "default",
                   eos_id=get_id("eos_token_id"), bos_id=get_id("bos_token_id"), pad_id=get_id("padding_token_id"),
                   add_bos=bool(metadata.get("tokenizer.ggml.add_bos_token", False)))

    @property
    def n_vocab(self) -> int:
        return len(self.tokens)

    @property
    def max_token_bytes(self) -> int:
        """The most bytes one token stands for: a text of b bytes is at least ceil(b / this) tokens."""
        if self._max_token_bytes is None:
            self._max_token_bytes = max(len(self.token_bytes(i)) for i in range(len(self.tokens))) or 1
        return self._max_token_bytes

    def fewest_tokens(self, text: str) -> int:
        """A lower bound on len(encode(text)) from its byte length alone: whether a prompt can fit a context is
        often decided before encoding it."""
        return -(-len(text.encode("utf-8", errors="replace")) // self.max_token_bytes)

    @property
    def eog_ids(self) -> tuple[int, ...]:
        """End-of-generation ids: eos plus the chat-turn enders llama.cpp also stops at (by token text)."""
        ids = {self.vocab[t] for t in EOG_TEXTS if t in self.vocab}
        return tuple(sorted(ids | ({self.eos_id} if self.eos_id is not None else set())))

    def token_to_id(self, text: str) -> int:
        """The id of a token text as stored ("Ġhello", "<|im_end|>"); KeyError if there is none."""
        return self.vocab[text]

    def id_to_token(self, token_id: int) -> str:
        """The stored text of a token ("Ġhello" for " hello")."""
        return self.tokens[self.check_id(token_id)]

    def check_id(self, token_id: int) -> int:
        token_id = int(token_id)
        if not 0 <= token_id < len(self.tokens):
            raise ValueError(f"token id {token_id} is out of range for a vocabulary of {len(self.tokens)} tokens")
        return token_id

    # ------------------------------------------------------------------------------------------ encode

    def encode(self, text: str, allow_special: bool = True, limit: int | None = None) -> list[int]:
        """text -> token ids. allow_special: CONTROL token texts such as "<|im_start|>" become their ids
        (llama.cpp's parse_special); if False they are encoded as plain text. USER_DEFINED tokens
        ("<think>") are always matched, as in llama.cpp. Never adds BOS.

        limit: raise TooManyTokens as soon as the text is known to have more than `limit` tokens, so a text
        that will be refused costs the pre-tokenization (lazy: iter_words) and BPE of no more than its first
        `limit` tokens' words, none of them cached beyond encode_word's bound: a word of b bytes is at least
        ceil(b / max_token_bytes) tokens, so one that cannot fit is refused before BPE runs on it (a word can
        be a megabyte without a space), and so is a whole text whose byte length already says so. Under the
        limit the ids are those of encode(text).
        """
        if limit is not None and self.fewest_tokens(text) > limit:
            raise TooManyTokens(limit)
        ids = []
        for piece in self.split_special(text, allow_special):
            if isinstance(piece, int):
                ids.append(piece)
            else:
                for word in iter_words(piece, self.patterns):
                    if limit is not None and len(ids) + self.fewest_tokens(word) > limit:
                        raise TooManyTokens(limit)
                    ids.extend(self.encode_word(word))
            if limit is not None and len(ids) > limit:
                raise TooManyTokens(limit)
        return ids

    def encode_word(self, word: str) -> list[int]:
        """Steps 3-4 on one pre-token, through the cache. The cache is bounded by characters, not entries: a
        word longer than CACHE_WORD_CHARS is encoded every time it comes (long words rarely repeat, and
        each would hold its length in memory), and the cache is emptied when its words' characters would pass
        CACHE_CHARS, or its entries CACHE_WORDS. So refused megabyte prompts cannot grow a server's memory."""
        ids = self.cache.get(word)
        if ids is None:
            ids = self.bpe("".join(BYTE_TO_CHAR[b] for b in word.encode("utf-8")))
            if len(word) <= CACHE_WORD_CHARS:
                if len(self.cache) >= CACHE_WORDS or self.cache_chars + len(word) > CACHE_CHARS:
                    self.cache.clear()
                    self.cache_chars = 0
                self.cache[word] = ids
                self.cache_chars += len(word)
        return ids

    def split_special(self, text: str, allow_special: bool) -> list[str | int]:
        """Step 1: cut special token texts out of the text, longest first (tokenizer_st_partition).

        "a<|im_end|>b<|im_end|>" -> ["a", 248046, "b", 248046]
        """
        pieces: list[str | int] = [text] if text else []
        for special, token_id in self.specials if allow_special else self.user_defined:
            cut = []
            for piece in pieces:
                if isinstance(piece, int) or special not in piece:
                    cut.append(piece)
                    continue
                for j, part in enumerate(piece.split(special)):
                    if j > 0:
                        cut.append(token_id)
                    if part:
                        cut.append(part)
            pieces = cut
        return pieces

    def bpe(self, word: str) -> list[int]:
        """Step 4 on one byte-level word: merge the lowest-rank adjacent pair until none is left.

        With merges ["Ġ h", "i n", "Ġh in"]:  "Ġhin" -> Ġ h i n -> Ġh i n -> Ġh in -> Ġhin

        The candidate pairs wait in a heap ordered by (rank, where the pair starts), so each merge costs
        O(log n) and a word of n characters O(n log n) (llama.cpp's llm_bigram_bpe queue does the same).
        Rescanning every pair for the best one after each merge costs O(n) a merge, O(n^2) a word: minutes
        for a 100k-character line without a space. A merged part keeps the position of its left half, so
        positions still order the parts left to right and the heap picks the leftmost of equal ranks. An entry
        whose parts have changed since it was pushed is stale (a part only grows, so its text tells) and skipped.
        """
        rank = self.merge_rank
        parts = list(word)  # parts[i]: the part starting at character i ("" once merged into its left neighbour)
        n = len(parts)
        right = list(range(1, n + 1))  # right[i]: where the next part starts (n: none)
        left = list(range(-1, n - 1))  # left[i]: where the previous part starts (-1: none)
        queue = [(r, i, parts[i], parts[i + 1]) for i in range(n - 1)
                 if (r := rank.get((parts[i], parts[i + 1]))) is not None]
        heapq.heapify(queue)
        while queue:
            _, i, a, b = heapq.heappop(queue)
            j = right[i]
            if parts[i] != a or j >= n or parts[j] != b:
                continue  # stale: one of the two parts has merged since
            parts[i], parts[j] = a + b, ""  # the pair becomes one part at i
            right[i] = right[j]
            if right[i] < n:
                left[right[i]] = i
            for lo in (left[i], i):  # the merged part's pairs with its new neighbours
                hi = right[lo] if lo >= 0 else n
                if lo >= 0 and hi < n and (r := rank.get((parts[lo], parts[hi]))) is not None:
                    heapq.heappush(queue, (r, lo, parts[lo], parts[hi]))
        parts = [p for p in parts if p]
        ids = []
        for part in parts:
            if part in self.vocab:
                ids.append(self.vocab[part])
            else:  # a merge made a string that is no token: fall back to its characters (never on real files)
                ids.extend(self.vocab[c] for c in part if c in self.vocab)
        return ids

    # ------------------------------------------------------------------------------------------ decode

    def decode_bytes(self, ids: Iterable[int]) -> bytes:
        """ids -> the raw bytes, for streaming (a character may end in the next token)."""
        return b"".join(self.token_bytes(token_id) for token_id in ids)

    def decode(self, ids: Iterable[int]) -> str:
        """ids -> text; bytes that are not valid UTF-8 (a cut-off character) become U+FFFD."""
        return self.decode_bytes(ids).decode("utf-8", errors="replace")

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes one token stands for (llama.cpp's token_to_piece with special = true).

        "Ġhello" (NORMAL) -> b" hello"     "<|im_end|>" (CONTROL) -> b"<|im_end|>"     "[PAD9]" (UNUSED) -> b""
        """
        token_id = self.check_id(token_id)
        text = self.tokens[token_id]
        kind = self.token_type[token_id]
        if kind == TokenType.NORMAL:
            # a character outside the byte table (never on real files) stands for its own UTF-8;
            # llama.cpp writes "[UNK_BYTE_0x..]" there instead
            return b"".join(bytes([CHAR_TO_BYTE[c]]) if c in CHAR_TO_BYTE else c.encode() for c in text)
        if kind in (TokenType.CONTROL, TokenType.USER_DEFINED, TokenType.UNKNOWN):
            return text.encode("utf-8")
        if kind == TokenType.BYTE:  # "<0x0A>"
            return bytes([int(text[3:5], 16)])
        return b""  # UNUSED and undefined types, as llama.cpp
