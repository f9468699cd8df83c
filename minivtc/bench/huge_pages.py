"""Memory on 2 MiB pages, for measuring: the machine's read bandwidth, which is the limit of a
decode step that reads every weight, is highest where the bytes read lie on 2 MiB pages.

Owns `collapse_onto_huge_pages` (ask Linux to back some tensors' memory with 2 MiB pages, in
place), `tensor_spans` (where a tensor's bytes lie, oneDNN's packed ones included) and
`whole_pages`. "Page" here is the operating system's unit of memory, not a KV block
(`engine/kv_pool.py`). `bench peer`'s read bandwidth (`peer.read_bandwidth`) sums a tensor moved
onto them, so the limit it reports is the machine's, not the 4 KiB pages'.

Why: the CPU translates every address through its TLB, which holds far fewer translations
than a gigabyte has 4 KiB pages; a stream through it misses the TLB page after page and walks
the page tables, on 2 MiB pages hardly. Linux gives 2 MiB pages where a program asks
(transparent huge pages "madvise", as on this project's machines) or everywhere ("always").
Since Linux 6.1, `madvise(MADV_COLLAPSE)` moves memory already written onto 2 MiB pages at the
same addresses, whatever allocator gave it. Best effort: on an older kernel, where the
administrator turned huge pages off ("never": the kernel's collapse would not ask, so this does),
where a huge page is not 2 MiB (arm64 with 16 or 64 KiB pages) or no 2 MiB of memory is free,
the bytes stay where they were. The engine's weights are not moved: the collapse copies every
page, a cost at every load that what it buys at batch 1 did not repay (both, measured:
`minivtc/bench/README.md`).
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterable
from pathlib import Path

import torch
from torch import Tensor

__all__ = ["HUGE_PAGE", "collapse_onto_huge_pages", "tensor_spans", "whole_pages"]

HUGE_PAGE = 2 << 20  # bytes: x86-64's transparent huge page (and arm64's with 4 KiB pages)
MADV_COLLAPSE = 25  # <asm-generic/mman-common.h>, Linux 6.1, the same on every architecture
THP = Path("/sys/kernel/mm/transparent_hugepage")


def collapse_onto_huge_pages(tensors: Iterable[Tensor]) -> int:
    """Back the memory of `tensors` (CPU) with 2 MiB pages, in place: same addresses, same bytes.
    Each span is widened to whole 2 MiB pages: the neighbours' bytes move too, unchanged, and a
    neighbour's page never written is filled with zeros (up to 2 MiB more memory per span end).
    The bytes now on 2 MiB pages that the kernel answered for; 0 where it cannot (above)."""
    if not huge_pages_allowed():  # (off Linux there is no such file: not allowed)
        return 0
    madvise = ctypes.CDLL(None).madvise
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    pages = [
        p for start, end in whole_pages(tensor_spans(tensors)) for p in range(start, end, HUGE_PAGE)
    ]
    # one page a call: a page the process has not wholly mapped (an end of a span) fails alone
    return sum(HUGE_PAGE for page in pages if madvise(page, HUGE_PAGE, MADV_COLLAPSE) == 0)


def huge_pages_allowed() -> bool:
    """Transparent huge pages of 2 MiB, not turned off by the administrator."""
    try:
        size = int((THP / "hpage_pmd_size").read_text())
        return size == HUGE_PAGE and "[never]" not in (THP / "enabled").read_text()
    except (OSError, ValueError):
        return False


def tensor_spans(tensors: Iterable[Tensor]) -> list[tuple[int, int]]:
    """(first byte, one past the last) of each CPU tensor's memory. A weight packed by oneDNN
    (`model/packed.py`) is an opaque tensor with no storage: oneDNN's own operators say where."""
    spans = []
    for t in tensors:
        if t.device.type != "cpu":
            continue
        if t.is_mkldnn:
            start, size = torch.ops.mkldnn.data_ptr(t), torch.ops.mkldnn._nbytes(t)
        else:
            start, size = t.untyped_storage().data_ptr(), t.untyped_storage().nbytes()
        spans.append((start, start + size))
    return spans


def whole_pages(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """`spans` widened to 2 MiB boundaries, those that then touch or overlap merged, in order
    (small tensors side by side share their 2 MiB pages, each collapsed once)."""
    merged: list[tuple[int, int]] = []
    for start, end in sorted(spans):
        start, end = start // HUGE_PAGE * HUGE_PAGE, -(-end // HUGE_PAGE) * HUGE_PAGE
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged
