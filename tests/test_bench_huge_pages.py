"""Memory moved onto 2 MiB pages (`bench/huge_pages.py`, what `bench peer` measures its read
bandwidth on): where the kernel can, the bytes land there, at the same addresses, unchanged."""

import re
import sys
from pathlib import Path

import pytest
import torch

from minivtc.bench.huge_pages import HUGE_PAGE, collapse_onto_huge_pages, tensor_spans, whole_pages
from minivtc.model.llama import CausalSequences
from minivtc.model.packed import can_pack, pack_linears
from minivtc.model.weights import load_model


def why_no_collapse() -> str | None:
    """Why this machine cannot collapse memory onto huge pages (None: it can)."""
    if not sys.platform.startswith("linux"):
        return "not Linux"
    release = tuple(
        int(n) for n in re.findall(r"\d+", Path("/proc/sys/kernel/osrelease").read_text())[:2]
    )
    if release < (6, 1):
        return f"Linux {release}: MADV_COLLAPSE came with 6.1"
    thp = Path("/sys/kernel/mm/transparent_hugepage")
    if not (thp / "enabled").exists() or "[never]" in (thp / "enabled").read_text():
        return "transparent huge pages are off on this machine"
    if int((thp / "hpage_pmd_size").read_text()) != HUGE_PAGE:
        return "this kernel's huge pages are not 2 MiB"
    return None


def huge_kib_around(address: int) -> int:
    """AnonHugePages (KiB) of the mapping that holds `address` (/proc/self/smaps)."""
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        if re.match(r"^[0-9a-f]+-[0-9a-f]+ ", line):
            start, end = (int(n, 16) for n in line.split()[0].split("-"))
            inside = start <= address < end
        elif inside and line.startswith("AnonHugePages:"):
            return int(line.split()[1])
    return 0


def test_spans_widen_to_whole_pages_and_merge_the_ones_that_touch():
    M = HUGE_PAGE
    spans = [(3 * M + 10, 3 * M + 20), (10, 100), (M - 5, M + 5), (7 * M, 9 * M)]
    assert whole_pages(spans) == [(0, 2 * M), (3 * M, 4 * M), (7 * M, 9 * M)]


def test_a_view_s_span_is_its_whole_storage():
    t = torch.zeros(1000)
    ((start, end),) = tensor_spans([t[10:20]])
    assert (start, end) == (t.data_ptr(), t.data_ptr() + 4000)


@pytest.mark.skipif(why_no_collapse() is not None, reason=str(why_no_collapse()))
def test_a_tensor_lands_on_huge_pages_at_the_same_address_unchanged():
    t = torch.randn(4 * HUGE_PAGE // 4, generator=torch.Generator().manual_seed(0))  # 8 MiB
    before, address = t.clone(), t.data_ptr()
    huge_kib = huge_kib_around(address)
    if huge_kib >= 3 * HUGE_PAGE // 1024:
        pytest.skip("already on huge pages (transparent huge pages 'always'): nothing to move")
    assert collapse_onto_huge_pages([t]) >= 3 * HUGE_PAGE  # the ends may share a mapping's edge
    assert huge_kib_around(address) - huge_kib >= 3 * HUGE_PAGE // 1024
    assert t.data_ptr() == address and torch.equal(t, before)


@pytest.mark.skipif(not can_pack(), reason="this PyTorch build has no oneDNN")
@pytest.mark.skipif(why_no_collapse() is not None, reason=str(why_no_collapse()))
def test_collapsing_a_packed_model_changes_no_bit_of_what_it_computes():
    model, _ = load_model(dtype="fp32")
    pack_linears(model)  # its weights now oneDNN's opaque tensors: their spans are oneDNN's
    ids = torch.randint(
        3, model.config.vocab_size, (40,), generator=torch.Generator().manual_seed(0)
    )
    positions = torch.cat([torch.arange(15), torch.arange(25)])
    before = model(ids, positions, CausalSequences([15, 25]))
    assert collapse_onto_huge_pages([*model.parameters(), *model.buffers()]) >= HUGE_PAGE
    assert torch.equal(model(ids, positions, CausalSequences([15, 25])), before)


@pytest.mark.parametrize(
    ("enabled", "size"), [("always madvise [never]", HUGE_PAGE), ("[madvise]", 64 << 20)]
)
def test_turned_off_or_not_2_mib_nothing_moves(enabled, size, tmp_path, monkeypatch):
    """An administrator's "never" is kept (the kernel's collapse would not ask), and a huge
    page of another size (arm64 with 64 KiB pages: 512 MiB) is not asked for 2 MiB at a time."""
    (tmp_path / "enabled").write_text(enabled + "\n")
    (tmp_path / "hpage_pmd_size").write_text(f"{size}\n")
    monkeypatch.setattr("minivtc.bench.huge_pages.THP", tmp_path)
    assert collapse_onto_huge_pages([torch.ones(4 * HUGE_PAGE // 4)]) == 0
