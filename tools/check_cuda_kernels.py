"""Compile every CUDA kernel tinyspec can launch, for each GPU architecture, with NVRTC: no GPU needed.

    python tools/check_cuda_kernels.py [--arch 75,80,90] [--gdn-k 16,64,128,256] [--json]

The cuda backend's kernels are CUDA C strings compiled at run time (CuPy hands them to NVRTC on first
use), so a kernel edited on a machine without a GPU was, until now, first compiled on a GPU. NVRTC is a
pip wheel (`pip install nvidia-cuda-nvrtc-cu12`, found through that package, or the library named in
$TINYSPEC_NVRTC) and compiles to a cubin without a device. For each architecture sm_XX this compiles:

    cuda_ops._SOURCE   once per weight type with the template instances the runtime asks for on that
                       architecture (cuda_ops.quant_kernel_names: the tensor-core kernel only on sm_80+),
                       and once per GDN head size K (cuda_ops.gdn_kernel_names)
    cuda_rows          the row-norm kernel, and each elementwise expression inside a minimal kernel
    cuda_moe           a MoE layer's routing and grouping by expert (route_k, group_k); the grouped expert
                       matmul (quant_linear_grouped_k) is in each weight type's cuda_ops module
    cuda_attention     the attention kernel (attend_rows: contiguous, paged and ragged alike)

with cuda_ops' options and -ftz=true (which CuPy appends), and reads ptxas' report: registers, spill
bytes and shared memory of every kernel. It fails (exit 1) if a module does not compile or an instance
the runtime would request is missing from the cubin. tests/test_cuda_compile.py runs it where NVRTC is
installed. What this cannot check: that a kernel computes the right thing or how fast (tests/test_cuda_ops.py
and tools/bench_cuda.py, on a GPU).

Output rows: arch, module, ok, and per kernel (name expression): registers, spill_stores, spill_loads
(bytes), smem (bytes); --json prints {"nvrtc": version, "modules": [...]}.
"""

from __future__ import annotations

import argparse
import ctypes
import glob
import json
import os
import re
import sys
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

try:
    import cupy  # noqa: F401  (the real one, where installed)
except ImportError:  # cuda_ops and cuda_rows need CuPy to launch kernels, not to be imported
    sys.modules["cupy"] = types.ModuleType("cupy")

from tinyspec.fast import cuda_attention, cuda_moe, cuda_ops, cuda_rows
from tinyspec.quants import GGMLType

ARCHS = (70, 75, 80, 86, 89, 90, 100, 120)  # Volta, Turing (T4), Ampere, Ada (L4), Hopper (H100), Blackwell
GDN_KS = (16, 32, 64, 128, 256)  # head sizes a model may have (qwen35: 128; the shipped tiny model: 16)
ELEMENTWISE_WRAPPER = """extern "C" __global__ void tinyspec_%s(const float* __restrict__ xs, float* __restrict__ ys,
                                            int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float x = xs[i];
    float y;
    %s;
    ys[i] = y;
}
"""


def load_nvrtc() -> ctypes.CDLL | None:
    """libnvrtc from $TINYSPEC_NVRTC, the nvidia-cuda-nvrtc-cu12 wheel, or the system; None if absent."""
    paths = [os.environ["TINYSPEC_NVRTC"]] if os.environ.get("TINYSPEC_NVRTC") else []
    try:
        import nvidia.cuda_nvrtc as wheel
        for d in wheel.__path__:
            paths += sorted(glob.glob(os.path.join(d, "lib", "libnvrtc.so.*"))) + \
                sorted(glob.glob(os.path.join(d, "bin", "nvrtc64_*.dll")))
    except ImportError:
        pass
    paths += ["libnvrtc.so.12", "libnvrtc.so"]
    for path in paths:
        try:
            return ctypes.CDLL(path)
        except OSError:
            continue
    return None


def nvrtc_version(lib) -> str:
    major, minor = ctypes.c_int(), ctypes.c_int()
    lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
    return f"{major.value}.{minor.value}"


def compile_cubin(lib, source: str, names: list[str], options: list[str], label: str) -> dict:
    """NVRTC source -> cubin: {"ok", "log", "lowered": {name expression: mangled name}, "cubin_bytes"}."""
    prog = ctypes.c_void_p()
    check = _checker(lib)
    check(lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), f"{label}.cu".encode(), 0, None, None))
    try:
        for name in names:
            check(lib.nvrtcAddNameExpression(prog, name.encode()))
        opts = (ctypes.c_char_p * len(options))(*(o.encode() for o in options))
        status = lib.nvrtcCompileProgram(prog, len(options), opts)
        size = ctypes.c_size_t()
        check(lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size)))
        buf = ctypes.create_string_buffer(size.value)
        check(lib.nvrtcGetProgramLog(prog, buf))
        out = {"ok": status == 0, "log": buf.value.decode(errors="replace"), "lowered": {}, "cubin_bytes": 0}
        if status != 0:
            return out
        for name in names:
            mangled = ctypes.c_char_p()
            if lib.nvrtcGetLoweredName(prog, name.encode(), ctypes.byref(mangled)) == 0:
                out["lowered"][name] = mangled.value.decode()
        cubin = ctypes.c_size_t()
        check(lib.nvrtcGetCUBINSize(prog, ctypes.byref(cubin)))
        out["cubin_bytes"] = cubin.value
        out["ok"] = cubin.value > 0 and len(out["lowered"]) == len(names)
        return out
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))


def _checker(lib):
    lib.nvrtcGetErrorString.restype = ctypes.c_char_p

    def check(status: int):
        if status != 0:
            raise RuntimeError(f"NVRTC: {lib.nvrtcGetErrorString(status).decode()}")
    return check


_ENTRY = re.compile(r"Compiling entry function '([^']+)' for 'sm_(\d+)'")
_SPILL = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers(?:.*?(\d+) bytes smem)?")


def ptxas_report(log: str) -> dict:
    """ptxas -v lines -> {mangled entry: {"registers", "spill_stores", "spill_loads", "smem"}}."""
    out, entry = {}, None
    for line in log.splitlines():
        if m := _ENTRY.search(line):
            entry = out.setdefault(m.group(1), {"registers": 0, "spill_stores": 0, "spill_loads": 0, "smem": 0})
        elif entry is not None and (m := _SPILL.search(line)):
            entry["spill_stores"], entry["spill_loads"] = int(m.group(1)), int(m.group(2))
        elif entry is not None and (m := _USED.search(line)):
            entry["registers"], entry["smem"] = int(m.group(1)), int(m.group(2) or 0)
    return out


def modules(cc: int, gdn_ks=GDN_KS) -> list[tuple[str, str, list[str]]]:
    """(label, source, name expressions) of every module the cuda backend builds on sm_<cc>."""
    out = [(f"quant_{GGMLType(t).name}", cuda_ops._SOURCE, cuda_ops.quant_kernel_names(GGMLType(t), cc))
           for t in cuda_ops.SUPPORTED]
    out += [(f"gdn_K{K}", cuda_ops._SOURCE, cuda_ops.gdn_kernel_names(K)) for K in gdn_ks]
    out.append(("rows_norm", cuda_rows.NORM_SOURCE, []))
    out.append(("moe_route", cuda_moe._SOURCE, []))  # extern "C": ptxas names route_k and group_k
    out += [(f"rows_{name}", ELEMENTWISE_WRAPPER % (name, expr), []) for name, expr in cuda_rows.ELEMENTWISE.items()]
    out.append(("attention", cuda_attention.SOURCE, []))
    return out


def check(lib, archs=ARCHS, gdn_ks=GDN_KS, progress=None) -> list[dict]:
    rows = []
    for cc in archs:
        options = [f"--gpu-architecture=sm_{cc}", *cuda_ops._OPTIONS, "-ftz=true", "--ptxas-options=-v"]
        for label, source, names in modules(cc, gdn_ks):
            res = compile_cubin(lib, source, names, options, label)
            report = ptxas_report(res["log"])
            by_name = {name: report.get(mangled, {}) for name, mangled in res["lowered"].items()}
            lowered = set(res["lowered"].values())  # extern "C" kernels (mma_prep_x, norm_rows) keep their names
            by_name |= {entry: r for entry, r in report.items() if entry not in lowered and not entry.startswith("_Z")}
            errors = [ln for ln in res["log"].splitlines() if "error" in ln.lower()]
            rows.append({"arch": cc, "module": label, "ok": res["ok"], "kernels": by_name,
                         "cubin_bytes": res["cubin_bytes"], "errors": errors[:5],
                         "missing": [n for n in names if n not in res["lowered"]]})
            if progress:
                progress(rows[-1])
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", default=",".join(map(str, ARCHS)),
                    help="compute capabilities to compile for, comma-separated (default %(default)s)")
    ap.add_argument("--gdn-k", default=",".join(map(str, GDN_KS)), help="GDN head sizes (default %(default)s)")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    args = ap.parse_args(argv)
    try:
        archs = [int(a) for a in args.arch.split(",") if a.strip()]
        gdn_ks = [int(k) for k in args.gdn_k.split(",") if k.strip()]
    except ValueError:
        ap.error("--arch and --gdn-k take comma-separated integers, e.g. --arch 75,90")
    bad = [k for k in gdn_ks if not 1 <= k <= cuda_ops.MAX_K]
    if bad:
        ap.error(f"--gdn-k: the scan kernel takes 1 <= K <= {cuda_ops.MAX_K}, got {bad}")
    lib = load_nvrtc()
    if lib is None:
        print("check_cuda_kernels: NVRTC not found; pip install nvidia-cuda-nvrtc-cu12 "
              "(or set TINYSPEC_NVRTC to libnvrtc's path)", file=sys.stderr)
        return 2

    def show(row):
        if args.json:
            return
        status = "ok" if row["ok"] else "FAILED"
        print(f"sm_{row['arch']} {row['module']:<16} {status}", flush=True)
        for name, r in row["kernels"].items():
            if r:
                print(f"    {name:<34} {r['registers']:>3} regs  spill {r['spill_stores']}/{r['spill_loads']} B"
                      f"  smem {r['smem']} B")
        for line in row["errors"] + [f"missing instance: {n}" for n in row["missing"]]:
            print(f"    {line}")

    try:
        rows = check(lib, archs, gdn_ks, progress=show)
    except RuntimeError as e:  # an architecture this NVRTC does not know, for one
        print(f"check_cuda_kernels: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({"nvrtc": nvrtc_version(lib), "modules": rows}, indent=1))
    failed = [f"sm_{r['arch']} {r['module']}" for r in rows if not r["ok"]]
    if failed:
        print(f"check_cuda_kernels: {len(failed)} module(s) failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
