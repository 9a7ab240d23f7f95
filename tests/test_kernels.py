"""kernels.py and placement.py: a model is handed its kernels (the math its layers call) and its placement (where
the numbers live), two immutable objects, and nothing patches them afterwards.

    built      a Model keeps no kernel of its own: model.kernels is a frozen Kernels, model.placement a frozen
               Placement, its read-only views (xp, to_device, to_host, backend) cannot be assigned, and ops keeps
               no table of fast paths
    split      no field is in both; Kernels holds functions only, what a device pass needs is the placement's
    backends   the cpu backend's Kernels name the Numba functions, the numpy backend's the oracle's
    the core   kernels, model and the modules they import never import tinyspec.fast
    one way    kernels imports the layers for its defaults; the layers are handed a Kernels and never import it,
               not even for an annotation
"""

from __future__ import annotations

import dataclasses
import inspect
import subprocess
import sys

import numpy as np
import pytest
from tiny_models import write_tiny_qwen35

from tinyspec import attention, gdn, moe, ops
from tinyspec.backends import load_model
from tinyspec.kernels import NUMPY, Kernels
from tinyspec.placement import HOST, Placement

KERNEL_FIELDS = [f.name for f in dataclasses.fields(Kernels)]
PLACEMENT_FIELDS = [f.name for f in dataclasses.fields(Placement)]


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    p = tmp_path_factory.mktemp("kernels") / "tiny.gguf"
    write_tiny_qwen35(p, seed=3, n_trunk=2, interval=2)
    return p


def test_a_built_model_holds_its_kernels_and_placement_in_two_frozen_objects(path):
    model = load_model(path, "numpy")
    assert model.kernels is NUMPY and model.placement is HOST and model.backend == "numpy" and model.xp is np
    # no kernel or placement field lives on the model itself
    assert not set(vars(model)) & (set(KERNEL_FIELDS) | set(PLACEMENT_FIELDS) | {"backend"})
    with pytest.raises(dataclasses.FrozenInstanceError):
        model.kernels.gdn_scan = None
    with pytest.raises(dataclasses.FrozenInstanceError):
        model.placement.to_host = None
    for view in ("xp", "to_device", "to_host", "backend"):
        with pytest.raises(AttributeError):
            setattr(model, view, None)
    assert (model.to_host, model.to_device) == (HOST.to_host, HOST.to_device)  # the views read the placement
    assert not hasattr(ops, "FUSED")
    with pytest.raises(ValueError, match="rollback"):
        Placement(rollback="undo")


def test_the_math_and_the_placement_share_no_field():
    """Kernels is the math a layer calls (every field but its name a function); where the numbers live (the array
    module, the copies, the device pass), the greedy rule, the ring, the graphs' counts and whether passes are padded
    for them are the placement's."""
    assert not set(KERNEL_FIELDS) & set(PLACEMENT_FIELDS)
    assert all(callable(getattr(NUMPY, f)) for f in KERNEL_FIELDS if f != "name")
    assert {"xp", "to_device", "to_host", "device_pass", "accept_greedy", "rollback", "graph_counts",
            "pad_rows"} == set(PLACEMENT_FIELDS)


def test_another_kernels_or_placement_makes_another_model_over_the_same_weights(path):
    model = load_model(path, "numpy")
    replay = model.with_placement(dataclasses.replace(model.placement, rollback="replay"))
    assert replay.tensors is model.tensors and replay.kernels is model.kernels and model.placement.rollback == "snapshot"
    assert type(replay.new_ring(2)).__name__ == "ReplayRing" and type(model.new_ring(2)).__name__ == "SnapshotRing"
    recorder = model.with_kernels(dataclasses.replace(model.kernels, silu=ops.silu))
    assert recorder.tensors is model.tensors and recorder.placement is model.placement


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
    from tinyspec.fast import numba_attention, numba_gdn, numba_rows

    oracle = load_model(path, "numpy").kernels
    assert (oracle.attend, oracle.gdn_scan, oracle.causal_conv) == (attention.attend, gdn.gdn_scan, gdn.causal_conv)
    assert (oracle.rms_norm, oracle.silu, oracle.linear) == (ops.rms_norm, ops.silu, ops.linear)
    loaded = load_model(path, "cpu")
    cpu, place = loaded.kernels, loaded.placement
    assert cpu.name == "cpu" and place.rollback == "replay"
    assert (cpu.attend, cpu.gdn_scan, cpu.causal_conv) == (numba_attention.attend, numba_gdn.gdn_scan,
                                                          numba_gdn.causal_conv)
    assert (cpu.rms_norm, cpu.silu) == (numba_rows.rms_norm, numba_rows.silu)  # one compiled call each
    assert place == dataclasses.replace(HOST, rollback="replay")  # the host's


def test_the_core_never_imports_the_fast_wing():
    """Every module of the teaching core (tinyspec/*.py) imports without pulling in tinyspec.fast: the wing plugs in
    through Kernels, Placement, drafters and policies, imported lazily where they are asked for (backends, the CLI, the demo's
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
    """The import goes one way: kernels.py imports gdn.py, attention.py and moe.py for the oracle's defaults, and
    the layers take their Kernels as a required argument, with no import back: not a lazy one inside a function
    for a default, not one under TYPE_CHECKING for an annotation (a circle even the type checker would walk)."""
    import ast

    for module in (gdn, attention, moe):
        tree = ast.parse(inspect.getsource(module))
        back = [node.lineno for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module in
                ("kernels", "tinyspec.kernels")]
        assert not back, f"{module.__name__} imports tinyspec.kernels at line {back}"
    for layer in (gdn.gdn_layer, gdn.gdn_layer_ragged, attention.attention_layer, attention.attention_layer_ragged,
                  moe.moe_ffn):
        assert inspect.signature(layer).parameters["kern"].default is inspect.Parameter.empty, layer.__name__
