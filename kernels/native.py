"""Native libraries: C++ sources built once with the system compiler, loaded through ctypes.

The CPU kernels (braid.kernels.cpu) and the lazy regex automaton (braid.grammars.regex.lazy) ship
as sources and are compiled on the machine that runs them, into ~/.cache/braid/<name>, keyed
by the sources, the compiler and the flags (and the CPU, for -march=native builds). Each
library's entry points are declared once, as {name: (argument types, result type)}.

Generic build code with no torch and nothing of the kernels: it lives here because kernels/
is the lowest layer, and it is the one module of another package that grammars/ imports.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path

log = logging.getLogger(__name__)

Signatures = dict[str, tuple[list, object]]  # entry point -> (argtypes, restype)
INSTALL_HINT = "install g++ (Debian/Ubuntu: apt install g++) or point $CXX at a C++ compiler"
_lock = threading.Lock()


def compiler() -> str | None:
    return os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")


def build(name: str, sources: list[Path], flags: list[str], build_dir: Path) -> Path:
    """The shared library of `sources` (headers may be listed too: they key the cache, and
    only .cpp files are compiled), built unless this build exists already. OSError when
    there is no compiler or the build fails, with the reason."""
    cxx = compiler()
    if cxx is None:
        raise OSError(f"no C++ compiler found: {INSTALL_HINT}")
    version = subprocess.run([cxx, "--version"], capture_output=True, text=True).stdout
    parts = [*(p.read_text() for p in sources), version, " ".join(flags)]
    if "-march=native" in flags:
        parts.append(cpu_signature())
    key = hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]
    target = build_dir / f"braid_{name}_{key}.so"
    with _lock:
        if target.is_file():
            return target
        build_dir.mkdir(parents=True, exist_ok=True)
        start = time.perf_counter()
        # Built under a temporary name and renamed into place: concurrent builders (bench
        # subprocesses, compile workers) never load a half-written library.
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=build_dir)
        os.close(fd)
        try:
            compiled = [str(p) for p in sources if p.suffix == ".cpp"]
            result = subprocess.run(
                [cxx, *flags, *compiled, "-o", tmp], capture_output=True, text=True
            )
            if result.returncode != 0:
                raise OSError(f"building {name} failed: {result.stderr.strip()[-2000:]}")
            os.replace(tmp, target)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    log.info("built %s in %.1f s", target, time.perf_counter() - start)
    return target


def load(path: Path, signatures: Signatures) -> ctypes.CDLL:
    """The library at `path`, its entry points typed as `signatures` says."""
    lib = ctypes.CDLL(str(path))
    for name, (argtypes, restype) in signatures.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = argtypes, restype
    return lib


def cpu_signature() -> str:
    """What -march=native compiles for: the CPU's model and flags."""
    try:
        with open("/proc/cpuinfo") as f:
            lines = [x for x in f if x.startswith(("model name", "flags"))]
        return "".join(sorted(set(lines)))
    except OSError:
        return platform.processor()
