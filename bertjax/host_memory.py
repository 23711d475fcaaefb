"""Keep the host memory a training step frees, so the next step does not fault it in again.

XLA's CPU runtime allocates each step's scratch memory (hundreds of MB for a small BERT; 594 MB
for the mini model's fine-tuning step at batch 32) from the C library and frees it when the
step ends. glibc serves such large blocks with a fresh `mmap` and returns them with `munmap`,
so the kernel zero-fills every page again on the next step: 150,000 page faults and a
quarter of a second of system time per step on a 2-core Xeon, a fifth of the step.
`keep_freed_memory()` tells glibc to serve every allocation from one heap it never shrinks,
so freed blocks are reused as they are.

It is a process-wide setting and must come before JAX starts its CPU runtime (before the
first `jax.devices()` or computation): threads that already allocated keep their own arenas.
It changes nothing where the C library is not glibc (macOS) or where another allocator is
preloaded (tcmalloc on TPU VMs), and nothing for accelerator memory. The price is that the
process keeps its peak host memory until it exits, which a training process does anyway.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import platform

# glibc's mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD, _M_MMAP_MAX, _M_ARENA_MAX = -1, -4, -8


def keep_freed_memory() -> bool:
    """Serve all allocations from glibc's main heap, never mmap'd, never trimmed. Returns
    whether it applied (False: not glibc)."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    # One arena: threads' own arenas serve blocks larger than their 64 MB heaps with mmap
    # whatever M_MMAP_MAX says; the main arena grows its heap instead.
    return all(libc.mallopt(param, value) == 1 for param, value in (
        (_M_ARENA_MAX, 1), (_M_MMAP_MAX, 0), (_M_TRIM_THRESHOLD, -1)))
