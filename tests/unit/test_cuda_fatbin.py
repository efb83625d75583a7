"""The fat binary reader the GPU-build tests judge Horovod's libraries by (tests/cuda_fatbin.py), on fat
binaries laid out as nvcc writes them, inside bytes that are not one."""

from __future__ import annotations

import struct

from tests.cuda_fatbin import FATBIN_MAGIC, gpu_code


def entry(kind: int, arch: int, payload: bytes) -> bytes:
    header = struct.pack("<HHIQ", kind, 0x0101, 64, len(payload)) + bytes(8)  # kind, version, sizes
    header += struct.pack("<HHI", 0, 0, arch) + bytes(64 - 32)  # minor, major, the architecture
    return header + payload


def fatbin(*entries: bytes) -> bytes:
    body = b"".join(entries)
    return struct.pack("<IHHQ", FATBIN_MAGIC, 1, 16, len(body)) + body


def test_cubins_and_ptx_are_named_by_their_architecture() -> None:
    one = fatbin(entry(2, 80, b"\x7fELF" + bytes(60)), entry(2, 90, b"\x7fELF" + bytes(28)))
    two = fatbin(entry(1, 90, b".version 8.8\n.target sm_90\n" + bytes(4)))
    library = b"\x7fELF...text..." + one + b"padding" + two + b"...compute_75 in a symbol name..."
    assert gpu_code(library) == ["compute_90", "sm_80", "sm_90"]


def test_names_in_strings_are_not_code() -> None:
    assert gpu_code(b"tmpxft_00002cd5_00000000-6_cuda_kernels.compute_90.cudafe1.cpp sm_80") == []
    # A magic number that heads no fat binary (another version or header size) is passed over.
    assert gpu_code(struct.pack("<IHHQ", FATBIN_MAGIC, 7, 16, 64) + entry(2, 80, bytes(8))) == []
