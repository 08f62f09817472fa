"""When freed memory goes back to the system: glibc's heap, set for decoding and for training.

A tensor's buffer comes from the C library's malloc. glibc gives a buffer of at least its mmap threshold
its own pages, handed back to the system when freed; smaller ones come from its heap, whose free top it
hands back once it exceeds the trim threshold. Pages handed back and asked for again are faulted in and
zeroed by the kernel, one 4 KiB page at a time. By default glibc moves both thresholds as buffers are freed;
two uses want opposite fixed settings:

- decoding (`return_large_buffers`): resident memory is what a user watches, and a token's buffers are
  small, so every buffer of 1 MiB or more goes back at once;
- training (`reuse_freed_buffers`): each step allocates and frees the same activations again (tens of MiB
  on the preset's model), so freed buffers stay for the next step; on glibc's defaults the step's freed heap
  top went back to the system and was faulted in again, ~9,500 pages a step.

Both do nothing where the C library is not glibc. And a buffer read front to back every token (a quantized
model's weights) can ask for 2 MiB pages (`huge_page_bytes`).
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import platform
from collections.abc import Iterator

import torch

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # mallopt's parameters
DEFAULT_TRIM = 128 * 1024  # glibc's trim threshold before it moves it
DEFAULT_MMAP = 128 * 1024  # glibc's mmap threshold before it moves it
MOST_MMAP = 32 * 2**20  # the largest mmap threshold glibc takes on 64-bit: bigger buffers always get pages
HUGE_PAGE = 2 * 2**20  # x86-64's and most ARM64 kernels' large page
_mmap_threshold: int | None = None  # the one this process set last (None: glibc's own, moving)


def _glibc() -> ctypes.CDLL | None:
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    return ctypes.CDLL(None)


def _mmap(libc: ctypes.CDLL, threshold: int) -> None:
    global _mmap_threshold
    libc.mallopt(M_MMAP_THRESHOLD, threshold)
    _mmap_threshold = threshold


def return_large_buffers() -> None:
    """From now on this process gives every buffer of 1 MiB or more back to the system when it is freed.
    glibc otherwise raises that threshold to the largest buffer freed so far and keeps such buffers in its
    heap: a prompt read from a GGUF's blocks (slabs of dequantized rows, one matrix after another) left
    ~90 MiB more resident than it ever held at once."""
    libc = _glibc()
    if libc is not None and _mmap_threshold != 1 << 20:
        _mmap(libc, 1 << 20)


@contextlib.contextmanager
def large_buffers_returned() -> Iterator[None]:
    """`return_large_buffers` while inside; on leaving, the mmap threshold this process had set is set again.
    (glibc's own threshold, which moves, cannot be set back once fixed: a process that had set none gets
    glibc's starting value, DEFAULT_MMAP.)"""
    before = _mmap_threshold
    return_large_buffers()
    try:
        yield
    finally:
        libc = _glibc()
        if libc is not None:
            _mmap(libc, before if before is not None else DEFAULT_MMAP)


def hand_back_free_memory() -> None:
    """The heap's free memory goes back to the system now (glibc's malloc_trim), wherever it lies in the heap:
    after buffers of under the mmap threshold are freed, glibc hands back only a free top otherwise."""
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)


@contextlib.contextmanager
def reuse_freed_buffers() -> Iterator[None]:
    """While inside, freed buffers below 32 MiB stay in the heap for the next allocation and the heap's
    free top is never handed back. On leaving, the trim threshold is glibc's default again, the heap's free
    memory goes back to the system (malloc_trim), and the mmap threshold is the one set before, if any."""
    libc = _glibc()
    if libc is None:
        yield
        return
    before = _mmap_threshold
    _mmap(libc, MOST_MMAP)
    libc.mallopt(M_TRIM_THRESHOLD, 2**31 - 1)  # (an int: about 2 GiB, more than a step frees at the top)
    try:
        yield
    finally:
        libc.mallopt(M_TRIM_THRESHOLD, DEFAULT_TRIM)
        if before is not None:
            _mmap(libc, before)
        hand_back_free_memory()


def huge_page_bytes(n: int) -> torch.Tensor:
    """n bytes (uint8, CPU), in 2 MiB pages where Linux gives them (transparent huge pages, asked for with
    madvise: most distributions give them only when asked), else plain torch.empty. A buffer that a decoded
    token reads front to back (a quantized model's ~100 MB of weights) then crosses a page every 2 MiB instead
    of every 4 KiB: ~500 times fewer TLB misses, each a walk of the page tables (in a virtual machine, of two
    sets of them) while the product waits for its bytes. The buffer is its own anonymous mapping, given back
    to the system when the last tensor that views it is freed."""
    if platform.system() != "Linux" or not hasattr(mmap, "MADV_HUGEPAGE") or n < HUGE_PAGE:
        return torch.empty(n, dtype=torch.uint8)
    region = mmap.mmap(-1, n + HUGE_PAGE, flags=mmap.MAP_PRIVATE)  # (anonymous; the tensor keeps it alive)
    try:
        region.madvise(mmap.MADV_HUGEPAGE)
    except OSError:  # (a kernel without transparent huge pages: 4 KiB pages, the same bytes)
        pass
    whole = torch.frombuffer(region, dtype=torch.uint8)
    skip = -whole.data_ptr() % HUGE_PAGE  # (from a 2 MiB boundary: every page of it can be a large one)
    return whole[skip: skip + n]
