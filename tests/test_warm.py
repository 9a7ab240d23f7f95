"""tinyspec.fast.warm compiles the kernels a model calls, with the argument types it calls them with.

A warm job that compiled another signature than the backend's (a writeable weight array where the backend
passes a read-only one, a tuple of another length) would leave the real one to compile on first use, and the
warm-up would only cost time. So: in a fresh process, on the cache the suite's start warmed (tests/conftest.py),
a dense Q8_0 model, a K-quant model and a mixture-of-experts model run one-sequence decoding with drafts and
batches of 3 and 5 sequences, and no cached kernel may miss the cache.
"""

import json
import subprocess
import sys

import pytest

pytest.importorskip("numba")

from tinyspec.fast import warm  # noqa: E402

PROBE = """
import json, sys
from tinyspec.backends import load_model
from tinyspec.batch import batch_generate
from tinyspec.scheduler import EngineOptions
from tinyspec.generate import generate
from tinyspec.mtp import MTPDrafter
import numba
from tinyspec.fast import numba_attention, numba_gdn, numba_ops

for path in sys.argv[1:]:
    m = load_model(path, "cpu")
    generate(m, [1, 2, 3, 4], 3, drafter=MTPDrafter(m), draft_n=2)
    for B in (3, 5):
        batch_generate(m, [[1, 2, 3 + i] for i in range(B)], 2, drafter=MTPDrafter(m), draft_n=2,
                       options=EngineOptions(slots=B))
misses = {f"{mod.__name__}.{name}": len(d.stats.cache_misses)
          for mod in (numba_ops, numba_gdn, numba_attention) for name, d in vars(mod).items()
          if isinstance(d, numba.core.dispatcher.Dispatcher) and d.stats.cache_misses}
print(json.dumps(misses))
"""


def test_a_model_run_after_warm_compiles_nothing(tmp_path):
    if not warm.is_warm():
        pytest.skip("the kernel cache was not warmed (a targeted run; the whole suite warms it first)")
    from tinyspec.demo import ASSETS
    from tinyspec.fast import synth

    dense = tmp_path / "k-quant.gguf"
    synth.synth_model(dense, "0.8b", "q4_k_m", n_layers=4, n_vocab=512)
    moe = tmp_path / "moe.gguf"
    synth.synth_model(moe, "35b-a3b", "q4_k_m", n_layers=1, n_vocab=512, n_expert=8)
    out = subprocess.run([sys.executable, "-c", PROBE, str(ASSETS / "tiny-target.gguf"), str(dense), str(moe)],
                         capture_output=True, text=True, check=True).stdout
    assert json.loads(out.strip().splitlines()[-1]) == {}


def test_warm_refuses_nonsense(capsys):
    with pytest.raises(SystemExit) as exc:
        warm.main(["--processes", "0"])
    assert exc.value.code == 2 and "at least 1" in capsys.readouterr().err
