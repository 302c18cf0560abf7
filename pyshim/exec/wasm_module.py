"""The CPU engine's WebAssembly module (shaders/wasm/engine.c): where it is built, and its native face.

`pyshim setup` compiles the C source with `zig cc` (the `ziglang` package) to `web/vendor/pyshim-cpu.wasm`:
SIMD128, the wasm32-wasi reactor model (zig's libc math, no imports, one exported memory), with twins for
threads, relaxed SIMD and 64-bit memory (memory64: models past 4 GiB, wasm64-freestanding). The executor
(pyshim.exec.wasm_runner) sees the module through one small face — `alloc`, `write`, `read`, `call`,
`run` — so that the same recorder drives wasmtime natively (`NativeModule`, here) and, in the browser,
the page's WebAssembly instance.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Protocol

import numpy as np

from pyshim.errors import OutOfMemoryError, SetupError, UnsupportedError
from pyshim.paths import VENDOR_DIR, shaders_dir
from pyshim.plan.settings import MAX_THREADS

MODULE_NAME = "pyshim-cpu.wasm"
THREADED_NAME = "pyshim-cpu-mt.wasm"
RELAXED_SUFFIX = "-relaxed"     # pyshim-cpu-relaxed.wasm, pyshim-cpu-mt-relaxed.wasm
# SIMD128 only (every browser with WebAssembly SIMD: Chrome 91+, Firefox 89+, Safari 16.4+); -O3 so the
# loops vectorize beyond the intrinsics
CFLAGS = ("--target=wasm32-wasi", "-mexec-model=reactor", "-O3", "-msimd128", "-s", "-Wall", "-Wextra",
          "-Wno-unused-parameter", "-Werror")
# The threaded build for cross-origin isolated pages: atomics and a shared memory the page makes and
# every Web Worker's instance imports (at most 4 GiB less a page: wasm32's largest); each helper gets its
# own stack and thread-local block, so the stack pointer and TLS initializer are exported.
THREADED_FLAGS = ("-mcpu=generic+simd128+atomics+bulk_memory", "-Wl,--shared-memory", "-Wl,--import-memory",
                  "-Wl,--max-memory=4294901760", "-Wl,--export=__stack_pointer", "-Wl,--export=__wasm_init_tls",
                  "-Wl,--export=__tls_size", "-Wl,--export=__tls_align")
# Relaxed SIMD (Chrome 114+, wasmtime): the integer dot products of int8 activations against the weights'
# unsigned levels in one instruction (pmaddubsw, sdot) where SIMD128 needs six; each build has a relaxed
# twin, used where the runtime validates it (web/engine/cpu.js, NativeModule)
RELAXED_FLAGS = ("-mrelaxed-simd",)
# The 64-bit build (memory64: Chrome 133+, Firefox 134+, wasmtime), for a model whose weights, cache and
# activations pass wasm32's 4 GiB: the same source for wasm64-freestanding (wasi-libc is wasm32 only;
# engine.c's header says where its math comes from), pointers and program words 64-bit. A browser gives
# a 64-bit memory at most 16 GiB (Chrome: 262144 pages), so that is its limit, threaded or not. It is
# linked by wasm-ld itself: zig cc's own parsing of --max-memory stops at 32 bits.
WIDE_TARGET = "wasm64-freestanding"
WIDE_MAX_MEMORY = 16 << 30
WIDE_STACK = 16 << 20       # (zig's default for the wasm32 builds)
WIDE_SUFFIX = "64"          # pyshim-cpu64.wasm, pyshim-cpu64-mt-relaxed.wasm, ...
PAGE = 65536


def source_path() -> Path:
    return shaders_dir() / "wasm" / "engine.c"


def module_path(*, threaded: bool = False, relaxed: bool = False, wide: bool = False) -> Path:
    name = THREADED_NAME if threaded else MODULE_NAME
    if wide:
        name = name.replace("pyshim-cpu", "pyshim-cpu" + WIDE_SUFFIX)
    if relaxed:
        name = name.replace(".wasm", RELAXED_SUFFIX + ".wasm")
    return VENDOR_DIR / name


def _flags(threaded: bool, relaxed: bool, wide: bool) -> tuple[str, ...]:
    """zig cc's flags for a build (for the 64-bit one: compiling only, wasm-ld links it)."""
    flags = CFLAGS + (THREADED_FLAGS if threaded else ()) + (RELAXED_FLAGS if relaxed else ())
    if wide:
        flags = (f"--target={WIDE_TARGET}",) + tuple(f for f in flags if f != "-s" and not f.startswith(("--target=", "-mexec-model=", "-Wl,")))
    return flags


def _wide_link_flags(threaded: bool) -> tuple[str, ...]:
    shared = ("--shared-memory", "--import-memory", "--export=__stack_pointer", "--export=__wasm_init_tls",
              "--export=__tls_size", "--export=__tls_align") if threaded else ()
    return ("-mwasm64", "--no-entry", "--strip-all", f"--max-memory={WIDE_MAX_MEMORY}", "-z", f"stack-size={WIDE_STACK}", *shared)


def _fingerprint(flags: tuple[str, ...]) -> str:
    """What a module was built from: the source (and libm64.zig) and the flags (a rebuild when any changes)."""
    sources = source_path().read_bytes() + _libm64_path().read_bytes()
    return hashlib.sha256(sources + " ".join(flags).encode()).hexdigest()


def _libm64_path() -> Path:
    return shaders_dir() / "wasm" / "libm64.zig"


VARIANTS = tuple((threaded, relaxed, wide) for wide in (False, True) for threaded in (False, True) for relaxed in (False, True))


def build_step() -> str:
    """`pyshim setup`'s step: the eight modules built (or found up to date; as many at once as there are
    cores, up to 4), described."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=max(1, min(4, os.cpu_count() or 1))) as pool:
        paths = list(pool.map(lambda v: build(threaded=v[0], relaxed=v[1], wide=v[2]), VARIANTS))
    return ", ".join(f"{p.name} {p.stat().st_size / 1024:.0f} KB" for p in paths)


def build(out: Path | None = None, *, force: bool = False, threaded: bool = False, relaxed: bool = False,
          wide: bool = False) -> Path:
    """Compile the engine to `out` (default web/vendor/pyshim-cpu[64][-mt][-relaxed].wasm as `wide`,
    `threaded` and `relaxed` say) unless a build of the same source and flags is there; returns the
    module's path. Needs the `ziglang` package."""
    flags = _flags(threaded, relaxed, wide)
    out = out or module_path(threaded=threaded, relaxed=relaxed, wide=wide)
    stamp = out.with_suffix(".sha256")
    want = _fingerprint(flags + (_wide_link_flags(threaded) if wide else ()))
    if not force and out.is_file() and stamp.is_file() and stamp.read_text().strip() == want:
        return out
    try:
        import ziglang  # noqa: F401
    except ImportError:
        raise UnsupportedError("the CPU engine is built with zig cc, which is not installed",
                               hint="pip install ziglang (or pip install -e '.[dev]'), then pyshim setup") from None
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    cache = str(Path(tempfile.gettempdir()) / "pyshim-zig-cache")      # (not under web/: the site serves that)
    env = dict(os.environ, ZIG_GLOBAL_CACHE_DIR=cache, ZIG_LOCAL_CACHE_DIR=cache)
    zig = [sys.executable, "-m", "ziglang"]
    if not wide:
        _run([*zig, "cc", *flags, "-o", str(tmp), str(source_path())], env)
    else:
        # engine.c compiled; libm64.zig with zig's compiler_rt (expf, sin, cos, memcpy) beside it; both linked
        cpu = ["-mcpu=generic+simd128+atomics+bulk_memory"] if threaded else []
        engine_o, libm_o = out.with_suffix(".engine.o"), out.with_suffix(".libm.o")
        try:
            _run([*zig, "cc", *flags, "-c", "-o", str(engine_o), str(source_path())], env)
            _run([*zig, "build-obj", "-target", WIDE_TARGET, *cpu, "-O", "ReleaseFast", "-fcompiler-rt",
                  str(_libm64_path()), f"-femit-bin={libm_o}"], env)
            _run([*zig, "wasm-ld", *_wide_link_flags(threaded), "-o", str(tmp), str(engine_o), str(libm_o)], env)
        finally:
            engine_o.unlink(missing_ok=True)
            libm_o.unlink(missing_ok=True)
    tmp.replace(out)
    stamp.write_text(want + "\n")
    return out


def _run(cmd: list[str], env: dict) -> None:
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise SetupError(f"building the CPU engine failed:\n{done.stderr.strip()}", hint="see shaders/wasm/engine.c")


class Module(Protocol):
    """What the executor needs of an instantiated engine module."""

    def alloc(self, nbytes: int) -> int:
        """A fresh, 64-byte aligned block of the module's memory (never freed); raises when memory is full."""

    def write(self, ptr: int, data) -> None:
        """Bytes (any buffer) into the module's memory at `ptr`."""

    def read(self, ptr: int, nbytes: int) -> bytes: ...

    def call(self, name: str, *args) -> int | float | None:
        """An exported kernel, pointers and sizes as ints, floats as floats."""

    @property
    def memory_bytes(self) -> int: ...

    threads: int                # threads a program runs on
    relaxed: bool               # the relaxed-SIMD build
    wide: bool                  # the 64-bit build (memory64)

    def close(self) -> None:
        """End the engine's helper threads."""


class NativeModule:
    """The engine under wasmtime in CPython (tests, `pyshim generate --backend wasm`). With `threads` > 1
    the threaded build over a shared memory, its helpers on Python threads (wasmtime's calls release the
    GIL, so they run in parallel), each in a store and instance of its own with its own stack. `relaxed`:
    the relaxed-SIMD build (None: where it is built; wasmtime runs relaxed SIMD). `wide`: the 64-bit build
    (memory64), for more than 4 GiB."""

    def __init__(self, path: Path | None = None, *, threads: int = 1, relaxed: bool | None = None, wide: bool = False):
        try:
            import wasmtime
        except ImportError:
            raise UnsupportedError("the CPU engine runs natively under wasmtime, which is not installed",
                                   hint="pip install wasmtime (or pip install -e '.[dev]')") from None
        self.threads = max(1, min(int(threads), MAX_THREADS))
        if path is None:
            if relaxed is None:
                relaxed = module_path(threaded=self.threads > 1, relaxed=True, wide=wide).is_file()
            path = module_path(threaded=self.threads > 1, relaxed=relaxed, wide=wide)
        self.relaxed = RELAXED_SUFFIX in path.name
        if not path.is_file():
            raise UnsupportedError(f"the CPU engine is not built ({path} is missing)", hint="run `pyshim setup`")
        config = wasmtime.Config()
        config.cranelift_opt_level = "speed"
        config.wasm_threads = config.shared_memory = self.threads > 1
        config.wasm_relaxed_simd = config.wasm_memory64 = True
        if self.threads > 1 and wide:   # a shared memory never moves: its whole 16 GiB reserved (address space, not RAM)
            config.memory_reservation = WIDE_MAX_MEMORY
        self._engine = wasmtime.Engine(config)
        self._store = wasmtime.Store(self._engine)
        module = wasmtime.Module.from_file(self._engine, str(path))
        imports = []
        if self.threads > 1:        # the memory the module imports, at least as large as it asks for
            want = next(i.type for i in module.imports if i.name == "memory")
            self.wide = want.is_64
            self._memory = _SharedMemory(self._engine, wasmtime.MemoryType(wasmtime.Limits(want.limits.min, want.limits.max),
                                                                           is_64=want.is_64, shared=True))
            imports = [self._memory]
        else:
            self.wide = next(e.type for e in module.exports if e.name == "memory").is_64
        self._instance = wasmtime.Instance(self._store, module, imports)
        self._exports = self._instance.exports(self._store)
        if self.threads == 1:
            self._memory = self._exports["memory"]
        self._funcs: dict = {}
        self.call("_initialize")
        self._helpers = []
        for tid in range(1, self.threads):
            stack = self.alloc(HELPER_STACK) + HELPER_STACK
            helper = threading.Thread(target=_helper, args=(self._engine, module, self._memory, tid, stack, self.wide), daemon=True,
                                      name=f"pyshim-cpu-{tid}")
            helper.start()
            self._helpers.append(helper)

    def close(self) -> None:
        """End the helper threads (they hold the shared memory)."""
        if self._helpers:
            self.call("stop_workers")
            for helper in self._helpers:
                helper.join(timeout=5)
            self._helpers = []

    def _func(self, name: str):
        if name not in self._funcs:
            self._funcs[name] = self._exports[name]
        return self._funcs[name]

    def call(self, name: str, *args):
        if name == "run" and self.threads > 1:
            return self._func("run_mt")(self._store, *args, self.threads)
        return self._func(name)(self._store, *args)

    def alloc(self, nbytes: int) -> int:
        ptr = self.call("alloc", int(nbytes)) if self.wide or nbytes < 2**32 else 0
        if ptr == 0:
            raise out_of_memory(nbytes, self.memory_bytes, self.wide)
        return ptr

    def _size(self) -> int:
        return self._memory.data_len() if self.threads > 1 else self._memory.data_len(self._store)

    def _view(self) -> np.ndarray:
        """The module's memory as a uint8 array (valid until the memory next grows)."""
        import ctypes

        base = self._memory.data_ptr() if self.threads > 1 else self._memory.data_ptr(self._store)
        return np.ctypeslib.as_array(ctypes.cast(base, ctypes.POINTER(ctypes.c_uint8)), shape=(self._size(),))

    def write(self, ptr: int, data) -> None:
        src = np.frombuffer(memoryview(data).cast("B"), dtype=np.uint8)
        self._view()[ptr:ptr + src.size] = src

    def read(self, ptr: int, nbytes: int) -> bytes:
        return self._view()[ptr:ptr + nbytes].tobytes()

    @property
    def memory_bytes(self) -> int:
        return self._size()


HELPER_STACK = 1 << 20      # a helper thread's C stack (the kernels' frames are small)


def _helper(engine, module, memory, tid: int, stack_top: int, wide: bool) -> None:
    """A helper thread: its own store and instance over the shared memory, its own stack, then the module's
    worker loop (which sleeps between runs until NativeModule.close stops it)."""
    import wasmtime

    store = wasmtime.Store(engine)
    exports = wasmtime.Instance(store, module, [memory]).exports(store)
    exports["__stack_pointer"].set_value(store, (wasmtime.Val.i64 if wide else wasmtime.Val.i32)(stack_top))
    exports["worker"](store, tid)


def _SharedMemory(engine, memory_type):
    """A wasmtime SharedMemory usable as an import (wasmtime-py 51's own _as_extern wraps its pointer once
    too often)."""
    import wasmtime
    from wasmtime import _ffi as ffi

    class SharedMemory(wasmtime.SharedMemory):
        def _as_extern(self):
            return ffi.wasmtime_extern_t(ffi.WASMTIME_EXTERN_SHAREDMEMORY, ffi.wasmtime_extern_union(sharedmemory=self.ptr()))

    return SharedMemory(engine, memory_type)


class PageModule:
    """The engine in the page: web/engine/cpu.js's instance, reached through Pyodide's proxies by duck typing
    (so no `js` import here). Python buffers go over as proxies the JS side copies from without a conversion."""

    def __init__(self, engine):
        self.engine = engine        # the JS object cpu.js's instantiate() made

    def alloc(self, nbytes: int) -> int:
        ptr = int(self.engine.alloc(int(nbytes))) if self.wide or nbytes < 2**32 else 0
        if ptr == 0:
            raise out_of_memory(nbytes, self.memory_bytes, self.wide)
        return ptr

    def write(self, ptr: int, data) -> None:
        self.engine.write(int(ptr), np.ascontiguousarray(data).reshape(-1).view(np.uint8))

    def read(self, ptr: int, nbytes: int) -> bytes:
        return self.engine.read(int(ptr), int(nbytes)).to_bytes()

    def call(self, name: str, *args):
        return self.engine.call(name, *args)

    @property
    def memory_bytes(self) -> int:
        return int(self.engine.memoryBytes())

    @property
    def threads(self) -> int:
        return int(self.engine.threads)

    @property
    def relaxed(self) -> bool:
        return bool(self.engine.relaxed)

    @property
    def wide(self) -> bool:
        return bool(self.engine.wide)

    def close(self) -> None:
        self.engine.close()


def out_of_memory(nbytes: int, have: int, wide: bool = False) -> OutOfMemoryError:
    end = "a 64-bit WebAssembly memory ends at 16 GB, or the browser gave no more" if wide else "WebAssembly's 32-bit memory ends at 4 GB"
    return OutOfMemoryError(f"the CPU engine's memory cannot grow by {nbytes / 2**20:.0f} MB (it holds {have / 2**20:.0f} MB; {end})",
                            hint="use a smaller model or a shorter context (--ctx)")
