"""Builds, caches and loads the table kernels' op library, or says why not.

The C++ sources ship in this package (`*.cc`). On first use they are compiled
against the installed TensorFlow (`tf.sysconfig` compile and link flags,
`$CXX` or `g++`, `-O3`) into a cache directory, `$NPU_REC_KERNEL_CACHE` or
`~/.cache/npu_rec/kernels`, under a file name keyed by the TensorFlow version
and a hash of the sources, flags and compiler; later processes load the cached
library (about 0.1 s) instead of building. The build compiles the sources it
hashed (copied to a temporary directory, so an edit during the build cannot
put other code under that name), one compiler process per source at once, and
links them into a temporary file renamed into place: a process never loads a
half-written library, and two processes building at once both succeed.

`NPU_REC_KERNELS` picks the path:

* `auto` (default): use the kernels when they build and load; otherwise log one
  WARNING naming the reason and how to get the fast path, and use the stock
  TensorFlow ops (the same results).
* `on`: the kernels must load; a failed build raises `RuntimeError` with the
  compiler's output.
* `off`: always the stock ops.

`NPU_REC_KERNEL_SANITIZE=1` builds with AddressSanitizer and
UndefinedBehaviorSanitizer (a separate cache entry; the process must preload
libasan, see `tests/run_sanitized_kernels.sh`).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time

import tensorflow as tf

from npu_rec import _log as logging

_SOURCES = (
    "table_ops.cc",
    "lookup_op.cc",
    "lookup_core.cc",
    "key_map.cc",
    "tier_io.cc",
    "exchange_ops.cc",
)
_HEADERS = ("kernel_util.h", "key_map.h", "lookup_core.h")
_MODES = ("auto", "on", "off")
# AddressSanitizer and the UndefinedBehaviorSanitizer checks that GCC 12 compiles
# TensorFlow's headers with (`-fsanitize=undefined` as a whole also turns on `null`
# and the nonnull-attribute checks, which make an absl `constexpr` in them fail).
_UBSAN = (
    "shift,integer-divide-by-zero,unreachable,vla-bound,return,signed-integer-overflow,"
    "bounds,alignment,object-size,bool,enum,builtin,pointer-overflow"
)
_SANITIZE_FLAGS = (
    f"-fsanitize=address,{_UBSAN}",
    "-fno-omit-frame-pointer",
    f"-fno-sanitize-recover={_UBSAN}",
)
_BUILD_TIMEOUT = 600
_LOCK = threading.Lock()
_STATE: dict = {}
_LOADED: dict = {}  # the op module loaded by this process (kept across `reset`)


def mode() -> str:
    """The requested path: `NPU_REC_KERNELS` (auto, on or off).

    Raises:
      ValueError: the variable holds another value.
    """
    value = os.environ.get("NPU_REC_KERNELS", "auto").strip().lower() or "auto"
    if value not in _MODES:
        raise ValueError(
            f"The environment variable NPU_REC_KERNELS must be one of {_MODES}. "
            f"Received: NPU_REC_KERNELS={value!r}"
        )
    return value


def cache_dir() -> str:
    """Directory of built libraries: `$NPU_REC_KERNEL_CACHE` or ~/.cache/npu_rec/kernels."""
    return os.environ.get("NPU_REC_KERNEL_CACHE") or os.path.join(
        os.path.expanduser("~"), ".cache", "npu_rec", "kernels"
    )


def _sanitize() -> bool:
    return os.environ.get("NPU_REC_KERNEL_SANITIZE", "") not in ("", "0")


def _compiler() -> str:
    return os.environ.get("CXX") or "g++"


def _flags() -> list[str]:
    """The compiler flags of every source (besides TensorFlow's)."""
    return [
        "-fPIC",
        *(["-O1", "-g", *_SANITIZE_FLAGS] if _sanitize() else ["-O3"]),
        "-ffp-contract=off",  # no fused multiply-add: the stock path's float32 rounding
        "-fno-math-errno",  # sqrt without the errno branch vectorises (same IEEE results)
        "-Wno-deprecated-declarations",
    ]


def compile_command(source: str, output: str) -> list[str]:
    """The compiler command line compiling `source` into the object file `output`."""
    return [_compiler(), *_flags(), "-c", source, "-o", output, *tf.sysconfig.get_compile_flags()]


def link_command(objects: list[str], output: str) -> list[str]:
    """The command line linking `objects` into the library `output`."""
    return [
        _compiler(),
        "-shared",
        *_flags(),
        *objects,
        "-o",
        output,
        *tf.sysconfig.get_link_flags(),
    ]


def _read_sources() -> dict[str, bytes]:
    """The kernel sources and headers shipped in this package: file name -> bytes."""
    here = os.path.dirname(os.path.abspath(__file__))
    files = {}
    for name in (*_SOURCES, *_HEADERS):
        with open(os.path.join(here, name), "rb") as f:
            files[name] = f.read()
    return files


def _cached_name(files: dict[str, bytes]) -> str:
    """The cache path of the library built from `files` (with this compiler and flags)."""
    digest = hashlib.sha256()
    for name in (*_SOURCES, *_HEADERS):
        digest.update(files[name])
    digest.update(" ".join(compile_command("SRC", "OUT")[1:]).encode())
    digest.update(" ".join(link_command(["OBJ"], "OUT")[1:]).encode())
    digest.update(_compiler().encode())
    tag = "asan-" if _sanitize() else ""
    return os.path.join(
        cache_dir(), f"npu_rec_ops-tf{tf.__version__}-{tag}{digest.hexdigest()[:16]}.so"
    )


def library_path() -> str:
    """Where the library for this TensorFlow, these sources and flags is cached."""
    return _cached_name(_read_sources())


def _run(commands: list[list[str]], logs: str) -> None:
    """Runs the commands at once, within `_BUILD_TIMEOUT` seconds in all.

    Each command's output goes to a file in the directory `logs` (a full pipe
    would stall a compiler while another one is waited for).

    Raises:
      RuntimeError: a command cannot start, fails (its output) or runs out of time.
    """
    procs = []
    try:
        for i, cmd in enumerate(commands):
            out = open(os.path.join(logs, f"command-{i}.log"), "w+")  # noqa: SIM115
            try:
                proc = subprocess.Popen(
                    cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
                )
            except OSError as err:
                out.close()
                raise RuntimeError(f"{cmd[0]} could not run: {err}") from err
            procs.append((cmd, out, proc))
        deadline = time.monotonic() + _BUILD_TIMEOUT
        running = list(procs)
        while running:  # the first failure ends the build at once
            for cmd, out, proc in list(running):
                if proc.poll() is None:
                    continue
                running.remove((cmd, out, proc))
                if proc.returncode != 0:
                    out.seek(0)
                    raise RuntimeError(
                        f"{' '.join(cmd)} failed (exit {proc.returncode}):\n{out.read()[-4000:]}"
                    )
            if running and time.monotonic() > deadline:
                raise RuntimeError(f"{running[0][0][0]} timed out after {_BUILD_TIMEOUT} s")
            time.sleep(0.05)
    finally:
        for _, out, proc in procs:
            if proc.poll() is None:  # the compiler and what it started (its own group)
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            out.close()


def build(path: str, files: dict[str, bytes] | None = None) -> None:
    """Compiles `files` (default: the package's sources) into `path` atomically.

    The sources are written to a temporary directory and compiled there, one
    compiler process per source at once; the objects are linked into a
    temporary file renamed to `path`.

    Raises:
      RuntimeError: the compiler is missing, fails or times out (with its output).
    """
    files = _read_sources() if files is None else files
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if shutil.which(_compiler()) is None:
        raise RuntimeError(f"no C++ compiler {_compiler()!r} (set CXX or install g++)")
    with tempfile.TemporaryDirectory(prefix=".build-", dir=os.path.dirname(path)) as work:
        for name, data in files.items():
            with open(os.path.join(work, name), "wb") as f:
                f.write(data)
        objects = [os.path.join(work, name + ".o") for name in _SOURCES]
        _run(
            [
                compile_command(os.path.join(work, name), obj)
                for name, obj in zip(_SOURCES, objects, strict=True)
            ],
            work,
        )
        tmp = os.path.join(work, "library.so")
        _run([link_command(objects, tmp)], work)
        os.replace(tmp, path)


def _load():
    # One op library per process: TensorFlow registers an op name once, so a second
    # library (the sources edited on disk while the process runs, then a `reset`)
    # would load without its ops.
    if "module" in _LOADED:
        return _LOADED["module"]
    files = _read_sources()
    path = _cached_name(files)
    if not os.path.exists(path):
        logging.info(
            "npu_rec: building the table kernels into %s (once per TensorFlow "
            "version and kernel source)",
            path,
        )
        build(path, files)
    try:
        _LOADED["module"] = tf.load_op_library(path)
    except (tf.errors.NotFoundError, OSError) as err:
        raise RuntimeError(f"{path} does not load: {err}") from err
    return _LOADED["module"]


def library():
    """The loaded op module, or None when the stock path is used (decided once).

    Raises:
      RuntimeError: `NPU_REC_KERNELS=on` and the kernels cannot be built or loaded.
      ValueError: `NPU_REC_KERNELS` holds an unknown value.
    """
    with _LOCK:
        if "lib" in _STATE:
            return _STATE["lib"]
        wanted = mode()
        lib = None
        if wanted != "off":
            try:
                lib = _load()
            except RuntimeError as err:
                if wanted == "on":
                    raise RuntimeError(
                        "NPU_REC_KERNELS=on, but npu_rec's table kernels could not be built "
                        f"or loaded: {err}"
                    ) from err
                first_line = str(err).splitlines()[0][:300]
                logging.warning(
                    "npu_rec: table kernels unavailable (%s); sparse tables use the stock "
                    "TensorFlow ops (same results, slower). For the fast path install a C++ "
                    "compiler (g++) or set CXX, then restart; NPU_REC_KERNELS=off silences "
                    "this.",
                    first_line,
                )
        _STATE["lib"] = lib
        return lib


def reset() -> None:
    """Forgets the decision (tests: re-read the environment on the next use)."""
    with _LOCK:
        _STATE.clear()


@contextlib.contextmanager
def forced(on: bool):
    """Within the block, tables created use the kernels (True) or the stock ops.

    For tests and benchmarks that compare the paths in one process: a table's
    path (its backend, `npu_rec.table._backend`) is fixed when it is created,
    so create each variant's tables inside their own block.
    """
    old = os.environ.get("NPU_REC_KERNELS")
    os.environ["NPU_REC_KERNELS"] = "on" if on else "off"
    reset()
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("NPU_REC_KERNELS", None)
        else:
            os.environ["NPU_REC_KERNELS"] = old
        reset()
