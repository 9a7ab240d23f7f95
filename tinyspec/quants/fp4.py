"""(being written)"""

DEQUANT = {}
QUANTIZE = {}
