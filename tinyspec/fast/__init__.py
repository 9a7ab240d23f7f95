"""The performance wing: everything that makes tinyspec fast, or measures how fast it is.

The teaching core (tinyspec/*.py) reads and runs without any of this; the wing plugs in through explicit
objects the core defines, never by patching it:

    kernels     tinyspec.kernels.Kernels, built by tinyspec.backends: the Numba leaves (numba_ops: fused
                dequant-matmul over the GGUF bytes; numba_attention; numba_gdn) and the CUDA leaves
                (cuda_ops, cuda_rows, cuda_attention, cuda_moe), each with the name, arguments and contract
                of the NumPy oracle function it replaces (numba_ops.quant_linear is tinyspec.ops.quant_linear),
                each tested against it; simd.py (the instructions they inline) and kernel_cache.py (drops
                stale compiled kernels)
    placement   tinyspec.placement.Placement, built by tinyspec.backends: where the cuda backend's numbers
                live, and what only a device needs: the device pass (cuda_pass, over rowmap's one row map),
                the greedy rule on the device (cuda_accept) and the CUDA graphs they replay (cuda_graphs)
    policy      adaptive.AdaptiveDraftLength: a draft-length policy (drafting.DraftPolicy) that picks k
                per step from measured acceptance and step costs
    drafter     synthetic.SyntheticDrafter: a drafter with a dialled acceptance rate, for speed work
    vocabulary  draft_vocab.DraftVocab (a sampling.DraftVocabulary): a frequency-ranked draft vocabulary a
                drafter scores instead of the whole vocabulary (mtp.MTPDrafter, draft.DraftModelDrafter take
                it as `vocab`)

and the measuring tools: synth.py (random-weight GGUFs at the published shapes) and bench.py (decode,
verify cost, bandwidth, speculative speedups); and weight_stationary.py, the plain Numba kernel that shows
why a verify pass of k + 1 tokens costs about one token (notebook 07 times it). Core modules never import
this package at import time; backends.py, the CLI and the demo's adaptive row import its modules lazily, so
tinyspec imports and runs without numba or cupy installed (tests/test_kernels.py).
"""
