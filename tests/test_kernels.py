"""kernels.py: a model is handed its kernels, one immutable object, and nothing patches it afterwards.

    built      a Model keeps no kernel of its own: model.kernels is a frozen Kernels, its read-only views
               (xp, to_device, to_host, backend) cannot be assigned, and ops keeps no table of fast paths
    backends   the cpu backend's Kernels name the Numba functions, the numpy backend's the oracle's
    the core   kernels, model and the modules they import never import tinyspec.fast
    one way    kernels imports the layers for its defaults; the layers are handed a Kernels and never import it
"""

from __future__ import annotations

import dataclasses
import inspect
import subprocess
import sys

import numpy as np
import pytest
from tiny_models import write_tiny_qwen35

from tinyspec import attention, gdn, ops
from tinyspec.backends import load_model
from tinyspec.kernels import NUMPY, Kernels

KERNEL_FIELDS = [f.name for f in dataclasses.fields(Kernels)]


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    p = tmp_path_factory.mktemp("kernels") / "tiny.gguf"
    write_tiny_qwen35(p, seed=3, n_trunk=2, interval=2)
    return p


def test_a_built_model_holds_its_kernels_in_one_frozen_object(path):
    model = load_model(path, "numpy")
    assert model.kernels is NUMPY and model.backend == "numpy" and model.xp is np
    assert not set(vars(model)) & (set(KERNEL_FIELDS) | {"backend"})  # no kernel lives on the model itself
    with pytest.raises(dataclasses.FrozenInstanceError):
        model.kernels.gdn_scan = None
    for view in ("xp", "to_device", "to_host", "backend"):
        with pytest.raises(AttributeError):
            setattr(model, view, None)
    assert not hasattr(ops, "FUSED")
    with pytest.raises(ValueError, match="rollback"):
        Kernels(rollback="undo")


def test_other_kernels_make_another_model_over_the_same_weights(path):
    model = load_model(path, "numpy")
    replay = model.with_kernels(dataclasses.replace(model.kernels, rollback="replay"))
    assert replay.tensors is model.tensors and model.kernels.rollback == "snapshot"
    assert type(replay.new_ring(2)).__name__ == "ReplayRing" and type(model.new_ring(2)).__name__ == "SnapshotRing"


@pytest.mark.parametrize("one", ["gdn_scan", "causal_conv", "attend_paged"])
def test_a_swapped_function_without_its_ragged_form_is_refused(path, one):
    """The layers call the ragged forms, and the oracle's ragged form loops over the oracle's one-sequence
    function: swapping only the one-sequence function would change nothing a pass computes. Refused at once."""
    original = getattr(NUMPY, one)

    def counting(*args, **kwargs):
        return original(*args, **kwargs)

    with pytest.raises(ValueError, match=f"swaps {one} but keeps the oracle's {one}_ragged"):
        dataclasses.replace(NUMPY, **{one: counting})
    ragged = getattr(NUMPY, f"{one}_ragged")
    both = dataclasses.replace(NUMPY, **{one: counting, f"{one}_ragged": lambda *a, **kw: ragged(*a, **kw)})
    assert getattr(both, one) is counting
    recorder = dataclasses.replace(NUMPY, **{f"{one}_ragged": lambda *a, **kw: ragged(*a, **kw)})  # notebook 02's recorder
    assert getattr(recorder, one) is original


def test_each_backend_names_its_functions(path):
    pytest.importorskip("numba")
    from tinyspec.fast import numba_attention, numba_gdn

    oracle = load_model(path, "numpy").kernels
    assert (oracle.attend, oracle.gdn_scan, oracle.causal_conv) == (attention.attend, gdn.gdn_scan, gdn.causal_conv)
    assert (oracle.rms_norm, oracle.silu, oracle.linear) == (ops.rms_norm, ops.silu, ops.linear)
    cpu = load_model(path, "cpu").kernels
    assert cpu.name == "cpu" and cpu.rollback == "replay"
    assert (cpu.attend, cpu.gdn_scan, cpu.causal_conv) == (numba_attention.attend, numba_gdn.gdn_scan,
                                                          numba_gdn.causal_conv)
    assert cpu.rms_norm is ops.rms_norm and cpu.xp is np  # the row functions and the host: the oracle's


def test_the_core_never_imports_the_fast_wing():
    """Every module of the teaching core (tinyspec/*.py) imports without pulling in tinyspec.fast: the wing plugs in
    through Kernels, drafters and policies, imported lazily where they are asked for (backends, the CLI, the demo's
    adaptive row)."""
    import pkgutil

    import tinyspec

    core = ["tinyspec"] + [f"tinyspec.{m.name}" for m in pkgutil.iter_modules(tinyspec.__path__) if not m.ispkg]
    assert {"tinyspec.speculate", "tinyspec.mtp", "tinyspec.draft", "tinyspec.demo", "tinyspec.backends"} <= set(core)
    code = ("import sys\n" + "".join(f"import {m}\n" for m in core)
            + "print(sorted(m for m in sys.modules if m.startswith('tinyspec.fast')))")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "[]"


def test_the_layers_never_import_the_kernels():
    """The import goes one way: kernels.py imports gdn.py and attention.py for the oracle's defaults, and the
    layers take their Kernels as a required argument, with no import back (not even a lazy one inside a
    function for a default); only the type checker reads kernels.py from them, for the annotation."""
    import ast

    for module in (gdn, attention):
        tree = ast.parse(inspect.getsource(module))
        type_only = {id(node) for stmt in tree.body if isinstance(stmt, ast.If) and ast.unparse(stmt.test) ==
                     "TYPE_CHECKING" for node in ast.walk(stmt)}
        back = [node.lineno for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module ==
                "kernels" and id(node) not in type_only]
        assert not back, f"{module.__name__} imports tinyspec.kernels at line {back}"
    for layer in (gdn.gdn_layer, gdn.gdn_layer_ragged, attention.attention_layer, attention.attention_layer_ragged):
        assert inspect.signature(layer).parameters["kern"].default is inspect.Parameter.empty, layer.__name__
