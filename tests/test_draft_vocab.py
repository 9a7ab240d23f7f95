"""The frequency-ranked draft vocabulary: drafts over a subset of the vocabulary, output unchanged.

Greedy: speculative output with a subset drafter equals plain output (the subset only limits what is
proposed). Sampling: the drafter's law is q = the subset law scattered over the whole vocabulary, and the
rejection rule keeps the target's law exactly for such a q (exact enumeration below; the end-to-end
chi-square runs in tests/test_speculate.py for the "mtp-vocab" and "draft-vocab" drafters).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_spec_sampling import one_draft_law
from tiny_models import write_tiny_qwen35

from tinyspec.backends import PackedWeight
from tinyspec.draft import DraftModelDrafter
from tinyspec.fast.draft_vocab import (
    DraftVocab,
    draw,
    rank_tokens,
    ranking_for,
    save_ranking,
    subset_rows,
)
from tinyspec.generate import generate, speculative_generate
from tinyspec.model import Model
from tinyspec.mtp import MTPDrafter
from tinyspec.quants import GGMLType, quantize
from tinyspec.sampling import SamplingParams


@pytest.fixture(scope="module")
def target(tmp_path_factory) -> Model:
    path = tmp_path_factory.mktemp("dv") / "target.gguf"
    write_tiny_qwen35(path, seed=31, n_trunk=4, interval=2)
    return Model.from_gguf(path)


@pytest.fixture(scope="module")
def draft_model(tmp_path_factory) -> Model:
    path = tmp_path_factory.mktemp("dv") / "draft.gguf"
    write_tiny_qwen35(path, seed=32, n_trunk=2, interval=2, D=16, F=24, mtp=False)
    return Model.from_gguf(path)


@pytest.mark.parametrize("ggml_type", [GGMLType.F32, GGMLType.Q8_0, GGMLType.Q4_K])
def test_subset_rows_scores_exactly_those_rows(ggml_type):
    numba_ops = pytest.importorskip("tinyspec.fast.numba_ops")
    rng = np.random.default_rng(0)
    w = rng.standard_normal((64, 256)).astype(np.float32)
    ids = rng.permutation(64)[:20]
    x = rng.standard_normal((3, 256)).astype(np.float32)
    packed = PackedWeight(quantize(w, ggml_type).reshape(-1), ggml_type, w.shape, numba_ops)
    sub = subset_rows(packed, ids)
    assert sub.shape == (20, 256) and sub.ggml_type == ggml_type
    # each output row is computed on its own by the kernel: a subset gives those rows bit for bit
    np.testing.assert_array_equal(sub.linear(x), packed.linear(x)[:, ids])
    np.testing.assert_array_equal(subset_rows(w, ids), w[ids])


def test_draw_scatters_the_subset_law():
    vocab = DraftVocab(np.array([7, 2, 5, 0, 1, 3, 4, 6]), 3, 8)  # subset ids 7, 2, 5
    token, q = draw(vocab, np.array([0.1, 2.0, -1.0]), SamplingParams(), np.random.default_rng(0))
    assert token == 2 and q is None  # greedy: the subset's argmax, a deterministic draft (q one-hot on it)
    token, q = draw(vocab, np.array([0.1, 2.0, -1.0]), SamplingParams(temperature=1.0), np.random.default_rng(0))
    assert token in (7, 2, 5) and q[[0, 1, 3, 4, 6]].sum() == 0 and abs(q.sum() - 1) < 1e-12


def test_bad_vocabularies_are_refused():
    with pytest.raises(ValueError, match="size"):
        DraftVocab(np.arange(8), 0, 8)
    with pytest.raises(ValueError, match="at least"):
        DraftVocab(np.arange(4), 6, 8)
    with pytest.raises(ValueError, match="repeats"):
        DraftVocab(np.array([1, 1, 2]), 3, 8)
    with pytest.raises(ValueError, match="ids in"):
        DraftVocab(np.array([0, 9]), 2, 8)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0, 1), min_size=6, max_size=6).filter(lambda w: sum(w) > 0),
       st.lists(st.floats(0, 1), min_size=3, max_size=3).filter(lambda w: sum(w) > 0),
       st.permutations(range(6)))
def test_subset_proposal_keeps_the_target_law_exactly(p, q_sub, ranking):
    """Exact enumeration on a 6-token vocabulary: a drafter limited to 3 ids (q zero elsewhere, so the
    target's mass outside the subset comes only from the residual) still emits exactly p_target."""
    p_target = np.array(p) / np.sum(p)
    vocab = DraftVocab(np.array(ranking), 3, 6)
    q = vocab.full_law(np.array(q_sub) / np.sum(q_sub))
    np.testing.assert_allclose(one_draft_law(p_target, q), p_target, rtol=0, atol=1e-12)


@pytest.mark.parametrize("kind", ["mtp", "draft"])
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**16), n=st.integers(1, 272), draft_n=st.integers(1, 6), max_new=st.integers(1, 20))
def test_greedy_output_is_identical_with_a_draft_vocabulary(target, draft_model, kind, seed, n, draft_n, max_new):
    rng = np.random.default_rng(seed)
    prompt = [int(t) for t in rng.integers(0, 272, 6)]
    vocab = DraftVocab(rng.permutation(272), n, 272)
    drafter = MTPDrafter(target, vocab) if kind == "mtp" else DraftModelDrafter(draft_model, target, vocab=vocab)
    spec = speculative_generate(target, drafter, prompt, max_new, draft_n)
    assert spec.tokens == generate(target, prompt, max_new).tokens


def test_drafts_come_from_the_subset_and_the_full_subset_changes_nothing(target):
    prompt = [40, 41, 42, 40, 41]
    full = MTPDrafter(target)
    everything = MTPDrafter(target, DraftVocab(np.arange(272), 272, 272))
    few = MTPDrafter(target, DraftVocab(np.random.default_rng(1).permutation(272), 9, 272))
    _, hidden = target.forward(np.array(prompt), target.new_state())
    params, rng = SamplingParams(), np.random.default_rng(0)
    for d in (full, everything, few):
        d.start(prompt, hidden, 4)
    assert everything.propose(42, 4, params, rng).tokens == full.propose(42, 4, params, rng).tokens
    draft = few.propose(42, 4, params, rng)
    drafts, q_rows = draft.tokens, draft.q_rows
    assert set(drafts) <= set(few.vocab.ids.tolist()) and q_rows == [None] * 4  # greedy: deterministic drafts
    few.start(prompt, hidden, 4)
    draft = few.propose(42, 4, SamplingParams(temperature=1.0), rng)
    drafts, q_rows = draft.tokens, draft.q_rows
    assert set(drafts) <= set(few.vocab.ids.tolist()) and all(abs(q[few.vocab.ids].sum() - 1.0) < 1e-12 for q in q_rows)


def test_rankings_from_text_metadata_and_files(target, tmp_path):
    class Chars:  # a tokenizer whose tokens are characters
        n_vocab = 272

        def encode(self, text):
            return [ord(c) for c in text]

    ranking = rank_tokens(Chars(), ["aab", "ba", "c"])  # a: 3, b: 2, c: 1, then unseen ids in order
    assert ranking[:4].tolist() == [ord("a"), ord("b"), ord("c"), 0] and np.unique(ranking).size == 272
    assert ranking_for(target).tolist() == list(range(272))  # no record: id order
    save_ranking(tmp_path / "r.npy", ranking)
    assert ranking_for(target, tmp_path / "r.npy").tolist() == ranking.tolist()
    np.save(tmp_path / "bad.npy", np.array([5, 300]))
    with pytest.raises(ValueError, match="272-token"):
        ranking_for(target, tmp_path / "bad.npy")


def test_a_model_without_a_record_ranks_by_the_standard_library_once(target, tmp_path, monkeypatch):
    """ranking_for with the model's tokenizer and no record: the token counts of the Python standard
    library's sources, computed once per vocabulary and then read from the cache."""
    from tinyspec.fast import draft_vocab
    from tinyspec.tokenizer import Tokenizer

    monkeypatch.setenv("TINYSPEC_CACHE", str(tmp_path))
    tok = Tokenizer.from_gguf(target.metadata)
    said = []
    ranking = ranking_for(target, tokenizer=tok, progress=said.append)
    assert sorted(ranking.tolist()) == list(range(target.cfg.n_vocab)) and len(said) == 1
    counts = np.bincount(tok.encode("".join(draft_vocab.stdlib_texts())), minlength=target.cfg.n_vocab)
    assert np.all(np.diff(counts[ranking]) <= 0)  # descending counts
    assert counts[ranking[0]] > 0 and ranking[:5].tolist() != list(range(5))  # not id order
    cached = list((tmp_path / "rankings").glob("*.npy"))
    assert len(cached) == 1
    monkeypatch.setattr(draft_vocab, "rank_tokens", lambda *a: pytest.fail("recounted despite the cache"))
    assert ranking_for(target, tokenizer=tok, progress=said.append).tolist() == ranking.tolist() and len(said) == 1


def test_generate_drafts_over_32k_tokens_by_default_only_for_large_vocabularies():
    """The CLI's default: AUTO_SIZE draft tokens above AUTO_ABOVE, the whole vocabulary below; 0 turns it off."""
    from types import SimpleNamespace

    from tinyspec.drafters import draft_vocab
    from tinyspec.fast.draft_vocab import AUTO_ABOVE, AUTO_SIZE, RANKING_KEY

    def model(n):
        return SimpleNamespace(cfg=SimpleNamespace(n_vocab=n), metadata={RANKING_KEY: np.arange(n)[::-1]})

    args = SimpleNamespace(draft_vocab=None, ranking=None)
    tok = SimpleNamespace(n_vocab=AUTO_ABOVE + 1)
    assert len(draft_vocab(args, model(AUTO_ABOVE + 1), tok)) == AUTO_SIZE
    assert draft_vocab(args, model(AUTO_ABOVE), SimpleNamespace(n_vocab=AUTO_ABOVE)) is None
    assert draft_vocab(SimpleNamespace(draft_vocab=0, ranking=None), model(AUTO_ABOVE + 1), tok) is None
    assert draft_vocab(args, model(AUTO_ABOVE + 1)) is None  # bench: no tokenizer, only an explicit --draft-vocab
    assert len(draft_vocab(SimpleNamespace(draft_vocab=100, ranking=None), model(4096), tok)) == 100
