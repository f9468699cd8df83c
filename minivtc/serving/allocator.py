"""The memory allocator an engine's process runs on: which library to preload, and in words.

Owns `preload_for` (an allocator's name -> the `LD_PRELOAD` that gives it), `restart_on` (what
`minivtc serve` does before torch loads: start itself again on the fast allocator), and
`describe` and `name_of` (what a server's first lines and a benchmark's tables say).
`minivtc bench peer` and `minivtc bench serve` choose their engines' allocator here too
(`--allocator`).

Why an allocator at all: PyTorch allocates every CPU tensor with `posix_memalign`, and oneDNN's
packed products (`model/packed.py`) make small aligned allocations in every call; glibc before
2.38 serves an aligned request outside its per-thread cache, under the arena's lock, while
TCMalloc and oneTBB's scalable allocator serve it from their caches as they do a plain `malloc`
(minivtc/bench/README.md has the counts, and the engine's speed on each allocator).

"auto", the default, is TCMalloc where the system has it (Debian, Ubuntu: `apt install
libtcmalloc-minimal4`; vLLM's documented CPU setting), else oneTBB's scalable allocator, which
the `tbb` wheel among this package's dependencies brings on x86-64 Linux, else glibc's malloc.
Preloading is for Linux only: elsewhere every name but "glibc" is refused and "auto" is "".
"""

from __future__ import annotations

import ctypes.util
import importlib.metadata
import os
import sys
from collections.abc import Mapping
from pathlib import Path

__all__ = ["ALLOCATOR_HELP", "ALLOCATORS", "describe", "name_of", "preload_for", "restart_on"]

ALLOCATORS = ("auto", "tcmalloc", "tbbmalloc", "glibc")
ALLOCATOR_HELP = (
    "every engine's allocator (default auto: TCMalloc where the system has it, else oneTBB's"
    " from the tbb wheel, else glibc's malloc)"
)
TCMALLOC_NAMES = ("tcmalloc_minimal", "tcmalloc")  # Debian's libtcmalloc-minimal4, gperftools'
# The proxy takes malloc's place; it calls the allocator beside it, which it does not find on
# its own (the wheel sets no library path), so both are preloaded, the allocator first.
TBB_LIBRARIES = ("libtbbmalloc.so.2", "libtbbmalloc_proxy.so.2")
INSTALL_HINT = (
    "install TCMalloc (Debian, Ubuntu: apt install libtcmalloc-minimal4) or oneTBB's allocator"
    " (x86-64: pip install tbb) for faster steps on glibc before 2.38; minivtc serve then"
    " preloads it"
)


def tcmalloc() -> str | None:
    """TCMalloc's library where the system has one, else None."""
    if sys.platform != "linux":
        return None
    return next(filter(None, map(ctypes.util.find_library, TCMALLOC_NAMES)), None)


def tbbmalloc() -> str | None:
    """oneTBB's scalable allocator from the installed `tbb` wheel, as an `LD_PRELOAD` value (two
    paths), else None."""
    if sys.platform != "linux":
        return None
    try:
        files = importlib.metadata.files("tbb") or []
    except importlib.metadata.PackageNotFoundError:
        return None
    found = {f.name: Path(str(f.locate())).resolve() for f in files if f.name in TBB_LIBRARIES}
    paths = [str(found[name]) for name in TBB_LIBRARIES if name in found and found[name].exists()]
    # LD_PRELOAD splits at spaces and colons: a path with either cannot be preloaded
    if len(paths) < len(TBB_LIBRARIES) or any(c in p for p in paths for c in " :"):
        return None
    return " ".join(paths)


def preload_for(name: str) -> str:
    """The `LD_PRELOAD` value that runs a process on allocator `name` (one of `ALLOCATORS`):
    "" for glibc's malloc, which is set all the same, so that a `minivtc serve` started with it
    does not choose again. A named allocator that is not installed is a ValueError."""
    if name not in ALLOCATORS:
        raise ValueError(f"unknown allocator {name!r}: one of {', '.join(ALLOCATORS)}")
    if name == "glibc":
        return ""
    if name == "auto":
        return tcmalloc() or tbbmalloc() or ""
    found = tcmalloc() if name == "tcmalloc" else tbbmalloc()
    if found is None:
        raise ValueError(f"allocator {name}: not installed here ({INSTALL_HINT})")
    return found


def restart_on(argv: list[str]) -> None:
    """Start `minivtc argv` again in this process on the "auto" allocator, where there is one
    and the user preloads nothing (an `LD_PRELOAD` set, even to nothing, is the user's choice).
    Returns only where there is nothing to do; otherwise the process is replaced
    (`os.execve`)."""
    if "LD_PRELOAD" in os.environ:
        return
    library = preload_for("auto")
    if not library:
        return
    command = [sys.executable, "-m", "minivtc", *argv]
    os.execve(sys.executable, command, dict(os.environ, LD_PRELOAD=library))


def name_of(preload: str | None) -> str:
    """The allocator that `LD_PRELOAD=preload` gives, in a few words ("glibc malloc" for none)."""
    if not preload:
        return "glibc malloc"
    if "tcmalloc" in preload:
        return "TCMalloc"
    return "oneTBB's scalable allocator" if "tbbmalloc" in preload else f"LD_PRELOAD={preload}"


def describe(env: Mapping[str, str]) -> str:
    """The allocator a process started with `env` runs on, for a server's first lines: the
    preload, and the install hint where it runs on glibc's malloc because nothing faster was
    found (not because the user chose it with an empty `LD_PRELOAD`)."""
    preloaded = env.get("LD_PRELOAD")
    name = name_of(preloaded)
    if preloaded:
        return name if name.startswith("LD_PRELOAD") else f"{name} (LD_PRELOAD={preloaded})"
    return name if preloaded == "" else f"{name}: {INSTALL_HINT}"
