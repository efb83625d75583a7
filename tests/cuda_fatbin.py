"""What GPU code a library carries: the entries of the CUDA fat binaries nvcc embeds in it (each a cubin for
one architecture, or PTX that the driver compiles for newer ones). Read from the fat binary headers, not from
strings: a symbol name such as `...cuda_kernels.compute_90.cudafe1.cpp` says nothing of the code and is gone
once the library is stripped. Standard library only: tests/e2e/test_gpu_image.py runs this file's source in
the image's own Python.

Layout (NVIDIA's fatbinary format, as the CUDA runtime reads it): a header (magic 0xBA55ED50, version 1,
header size 16, then the size of the entries that follow); each entry starts with its kind (1 PTX, 2 cubin),
its header size, its payload size, and, at offset 28, the architecture (80 for sm_80 / compute_80).
"""

from __future__ import annotations

import struct

FATBIN_MAGIC = 0xBA55ED50
KINDS = {1: "compute", 2: "sm"}  # PTX for a virtual architecture, a cubin for a real one


def gpu_code(data: bytes) -> list[str]:
    """The architectures of every fat binary entry in `data`, e.g. ["compute_90", "sm_80", "sm_90"]."""
    found: set[str] = set()
    magic = struct.pack("<I", FATBIN_MAGIC)
    at = data.find(magic)
    while at >= 0:
        version, header_size, entries_size = struct.unpack_from("<HHQ", data, at + 4)
        if version == 1 and header_size == 16:
            entry, end = at + header_size, at + header_size + entries_size
            while entry + 32 <= min(end, len(data)):
                kind, entry_header, payload = struct.unpack_from("<HxxIQ", data, entry)
                (arch,) = struct.unpack_from("<I", data, entry + 28)
                if kind not in KINDS or entry_header < 32:
                    break
                found.add(f"{KINDS[kind]}_{arch}")
                entry += entry_header + payload
        at = data.find(magic, at + 4)
    return sorted(found)
