"""The CUDA kernels run on the CPU: a RawKernel source compiled by the C++ compiler and launched on NumPy arrays.

tinyspec's kernels are CUDA C strings (fast/cuda_ops.py, cuda_moe.py, cuda_attention.py, cuda_rows.py) that CuPy
compiles with NVRTC on a GPU. Without one, tests/fake_cupy.py runs the oracle in their place, which checks the
Python around a kernel but never the kernel. This module runs the kernel itself:

    compile(code, names) -> Module       the source, with tests/cuda_on_cpu.h in front, compiled by g++ (or
                                         clang++, or $CXX) as C++17 into a shared library, one launcher per name
                                         (a template instance "quant_linear_k<12, 16, 4>" or an extern "C"
                                         kernel); cached on disk by a hash of everything that goes in
    Module.launch(name, grid, block, args, shared_mem)   args as fake_cupy hands them to a stand-in: NumPy
                                         arrays for pointers (the kernel gets their address), NumPy scalars
                                         typed as the C parameters; raises KernelError with the launch's message

The header emulates blocks of threads as fibers, __syncthreads, warp shuffles and votes, __shared__, mma.sync
(cuda_on_cpu.h's top comment lists what is and is not emulated: no memory model beyond the barriers, no race
or bounds detection, C's expf, the tensor core's internal rounding). Two source rewrites happen here, before the
compiler sees the code, because C++ has no spelling for them:

    extern __shared__ T name[];   ->  T* name = (T*)cuda_on_cpu::dynamic_shared();   (the launch's buffer)
    asm("opcode ..." : outs : ins) ->  ptx::opcode_with_underscores(outs..., ins...)  for the opcodes in PTX
                                       below, whose operand template must be exactly the one listed

Options: -O1 -ffp-contract=off (CuPy's --fmad=false: no product and sum fused unless the source says fmaf),
no -ffast-math. CuPy's -ftz=true is matched on x86 by the MXCSR flush bits during a launch (the header).

fake_cupy.install(monkeypatch, kernels="cpu") makes the fake's RawKernel and RawModule launch these compiled
kernels instead of their oracle stand-ins, and its ElementwiseKernel the operation (elementwise_source): the
real kernels against the oracle at small shapes in tests/test_kernels_on_cpu.py, the GPU file tests/test_cuda_ops.py
itself in tests/test_cuda_ops_on_cpu.py (opt-in), the emulation's own checks in tests/test_cuda_on_cpu.py.
`compiler()` is None where no C++ compiler is found; the tests skip then, saying so. The .so files are cached in
$TINYSPEC_CUDA_ON_CPU_CACHE (default: the temp dir's tinyspec-cuda-on-cpu-UID), about 1 s of g++ each, once.

Does NOT include: what the header does not emulate (above), CUDA's C++ beyond what tinyspec's kernels use (a
missing intrinsic is a compile error naming it: add it to the header), textures, atomics, cooperative groups.
"""

from __future__ import annotations

import ctypes
import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np

HEADER = Path(__file__).with_name("cuda_on_cpu.h")
FLAGS = ("-std=c++17", "-O1", "-ffp-contract=off", "-fno-fast-math", "-fPIC", "-shared", "-U_FORTIFY_SOURCE",
         "-w")
# asm opcodes the header implements, with the operand template each must have (spaces removed)
PTX = {
    "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32": "{%0,%1,%2,%3},{%4,%5,%6,%7},{%8,%9},{%0,%1,%2,%3};",
    "fma.rn.bf16x2": "%0,%1,%2,%3;",
    "cvt.f32.f16": "%0,%1;",
}


class KernelError(RuntimeError):
    """A launch the emulation refused: a barrier that cannot complete, a deadlock, a bad warp mask."""


def compiler() -> str | None:
    """The C++ compiler to use: $CXX, else g++, else clang++; None if there is none."""
    for name in (os.environ.get("CXX"), "g++", "clang++"):
        if name and (path := shutil.which(name)):
            return path
    return None


def cache_dir() -> Path:
    d = Path(os.environ.get("TINYSPEC_CUDA_ON_CPU_CACHE") or Path(tempfile.gettempdir()) / f"tinyspec-cuda-on-cpu-{os.getuid()}")
    d.mkdir(parents=True, exist_ok=True)
    return d


# ------------------------------------------------------------------ source rewrites


def _strip_comments(code: str) -> str:
    """Comments out (newlines kept, so the compiler's line numbers stay the source's); string literals kept."""
    def repl(m):
        s = m.group(0)
        return s if s.startswith('"') else "\n" * s.count("\n") or " "
    return re.sub(r'"(?:\\.|[^"\\])*"|//[^\n]*|/\*.*?\*/', repl, code, flags=re.DOTALL)


def _close(code: str, i: int) -> int:
    """Index of the ')' that closes the '(' at code[i - 1], skipping strings and nested parentheses."""
    depth = 1
    while depth:
        c = code[i]
        if c == '"':
            i = code.index('"', i + 1)
            while code[i - 1] == "\\":
                i = code.index('"', i + 1)
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
        i += 1
    return i - 1


def _split_top(text: str, sep: str) -> list[str]:
    """text split at each sep outside strings and parentheses."""
    parts, depth, start, in_str, i = [], 0, 0, False, 0
    while i < len(text):
        c = text[i]
        if in_str:
            in_str = not (c == '"' and text[i - 1] != "\\")
        elif c == '"':
            in_str = True
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
        elif c == sep and depth == 0:
            parts.append(text[start:i])
            start = i + 1
        i += 1
    return parts + [text[start:]]


def _rewrite_asm(code: str) -> str:
    out, at = [], 0
    for m in re.finditer(r"\basm\s*(?:volatile\s*)?\(", code):
        if m.start() < at:
            continue
        end = _close(code, m.end())
        sections = _split_top(code[m.end():end], ":")
        template = "".join(re.findall(r'"((?:\\.|[^"\\])*)"', sections[0]))
        opcode, _, operands = template.strip().partition(" ")
        if opcode not in PTX:
            raise ValueError(f"cuda_on_cpu: inline PTX {opcode!r} is not emulated (tests/cuda_on_cpu.h, PTX)")
        if re.sub(r"\s", "", operands) != PTX[opcode]:
            raise ValueError(f"cuda_on_cpu: asm {opcode!r} with operands {operands!r}, expected {PTX[opcode]!r}")
        args = []
        for section in sections[1:3]:
            for operand in _split_top(section, ","):
                if operand.strip():
                    om = re.fullmatch(r'\s*"[^"]*"\s*\((.*)\)\s*', operand, flags=re.DOTALL)
                    args.append(om[1])
        out += [code[at:m.start()], f"ptx::{opcode.replace('.', '_')}({', '.join(args)})"]
        at = end + 1
    return "".join(out) + code[at:]


def _rewrite_dynamic_shared(code: str) -> str:
    return re.sub(r"extern\s+__shared__\s+(?:__align__\(\d+\)\s+)?([\w ]+?)\s+(\w+)\s*\[\s*\]\s*;",
                  r"\1* \2 = (\1*)cuda_on_cpu::dynamic_shared();", code)


def extern_c_kernels(code: str) -> list[str]:
    """The extern "C" __global__ kernels of a source (their names are their symbols)."""
    return re.findall(r'extern\s+"C"\s+__global__\s+void\s+(?:__launch_bounds__\([^)]*\)\s+)?(\w+)\s*\(',
                      _strip_comments(code))


def elementwise_source(name: str, operation: str) -> str:
    """cupy.ElementwiseKernel("float32 x", "float32 y", operation, name) as a RawKernel source: one thread an
    element, as CuPy's generated kernel runs (its indexing of strided arrays aside: the caller passes contiguous
    arrays)."""
    return (f'extern "C" __global__ void {name}(const float* xs, float* ys, long long n) {{\n'
            "    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;\n"
            "    if (i >= n) return;\n"
            "    const float x = xs[i];\n"
            "    float y;\n"
            f"    {operation};\n"
            "    ys[i] = y;\n}\n")


def translate(code: str, names: list[str]) -> str:
    """The C++ file for code: the header, the rewritten source, then one launcher cuda_on_cpu_launch_<i> per name."""
    body = _rewrite_dynamic_shared(_rewrite_asm(_strip_comments(code)))
    launchers = [f'extern "C" int cuda_on_cpu_launch_{i}(const unsigned* dims, void** args, size_t shared, int ftz, '
                 f"char* err, int err_len) {{\n    return cuda_on_cpu::launch(&{name}, dims, args, shared, ftz, err, "
                 "err_len);\n}\n" for i, name in enumerate(names)]
    return f'#include "{HEADER}"\n#line 1 "kernel source"\n{body}\n' + "".join(launchers)


# ------------------------------------------------------------------ compile and launch


class Module:
    """A compiled source: launch(name, grid, block, args, shared_mem=0, ftz=True) runs one kernel to completion."""

    def __init__(self, path: Path, names: list[str]):
        self.path, self.names = path, list(names)
        self._lib = ctypes.CDLL(str(path))
        self._fns = {}
        for i, name in enumerate(self.names):
            fn = getattr(self._lib, f"cuda_on_cpu_launch_{i}")
            fn.restype = ctypes.c_int
            fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_char_p,
                           ctypes.c_int]
            self._fns[name] = fn

    def launch(self, name: str, grid, block, args, shared_mem: int = 0, ftz: bool = True) -> None:
        fn = self._fns.get(name)
        if fn is None:
            raise KeyError(f"cuda_on_cpu: {name!r} is not among the compiled kernels {self.names}")
        grid, block = tuple(grid) + (1,) * (3 - len(grid)), tuple(block) + (1,) * (3 - len(block))
        dims = np.array(grid + block, dtype=np.uint32)
        holders = []  # each argument's value in memory: an array's address, or the scalar itself
        for a in args:
            if isinstance(a, np.ndarray):
                holders.append(np.array([a.ctypes.data], dtype=np.uintp))
            elif isinstance(a, np.generic):
                holders.append(np.array([a], dtype=a.dtype))
            else:
                raise TypeError(f"cuda_on_cpu: kernel {name}: argument {a!r} is neither an array nor a typed scalar")
        ptrs = np.array([h.ctypes.data for h in holders], dtype=np.uintp)
        err = ctypes.create_string_buffer(1024)
        if fn(dims.ctypes.data, ptrs.ctypes.data, int(shared_mem), int(ftz), err, len(err)):
            raise KernelError(f"kernel {name}: {err.value.decode()}")


_loaded: dict[str, Module] = {}  # hash -> module, once per process


def compile(code: str, names: list[str]) -> Module:
    """code's kernels `names` compiled for the CPU (the .so cached on disk: a lock keeps two processes from
    compiling the same one, and the file appears whole, by rename)."""
    cxx = compiler()
    if cxx is None:
        raise RuntimeError("cuda_on_cpu: no C++ compiler ($CXX, g++ or clang++)")
    source = translate(code, names)
    key = hashlib.sha256("\0".join([cxx, *FLAGS, HEADER.read_text(), source]).encode()).hexdigest()[:24]
    if key in _loaded:
        return _loaded[key]
    d = cache_dir()
    so = d / f"{key}.so"
    if not so.exists():
        with open(d / f"{key}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not so.exists():
                cpp = d / f"{key}.cpp"
                cpp.write_text(source)
                tmp = d / f"{key}.{os.getpid()}.so"
                run = subprocess.run([cxx, *FLAGS, str(cpp), "-o", str(tmp)], check=False, capture_output=True,
                                     text=True)
                if run.returncode:
                    raise RuntimeError(f"cuda_on_cpu: {cxx} failed on {cpp}:\n{run.stderr[-4000:]}")
                os.replace(tmp, so)
    module = _loaded[key] = Module(so, names)
    return module
