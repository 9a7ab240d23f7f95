"""tinyspec: speculative decoding on hybrid Gated-DeltaNet (qwen35) models, every piece readable.

Re-exports only; see README.md for the map of modules to concepts.
"""

from .gguf import GGUFError, GGUFFile, TensorInfo, read_gguf, write_gguf
from .quants import GGMLType, QuantError, dequantize, quantize

__version__ = "0.1.0"

__all__ = [
    "GGUFError", "GGUFFile", "TensorInfo", "read_gguf", "write_gguf",
    "GGMLType", "QuantError", "dequantize", "quantize",
]
