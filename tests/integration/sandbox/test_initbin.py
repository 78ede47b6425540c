"""The compiled init is linked statically where the C library allows it, dynamically otherwise."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from corral.sandbox import initbin

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")

_PT_INTERP = 3


def _has_interpreter(path: str) -> bool:
    """Whether an ELF64 little-endian file names a dynamic loader (a PT_INTERP header)."""
    data = Path(path).read_bytes()
    assert data[:6] == b"\x7fELF\x02\x01"
    phoff = int.from_bytes(data[32:40], "little")
    size, count = int.from_bytes(data[54:56], "little"), int.from_bytes(data[56:58], "little")
    return any(
        int.from_bytes(data[phoff + i * size : phoff + i * size + 4], "little") == _PT_INTERP
        for i in range(count)
    )


def _works(binary: str) -> None:
    r, w = os.pipe()
    proc = subprocess.run([binary, str(w), "--", "sh", "-c", "exit 7"], pass_fds=(w,), check=False)
    os.close(w)
    with os.fdopen(r, "rb") as fh:
        events = fh.read()
    assert proc.returncode == 7
    assert b'"event": "exit", "code": 7' in events


def _static_libc() -> bool:
    if shutil.which("cc") is None:
        return False
    out = subprocess.run(
        ["cc", "-print-file-name=libc.a"], capture_output=True, text=True, check=False
    )
    return os.path.isabs(out.stdout.strip())


@pytest.mark.skipif(not _static_libc(), reason="the C library has no static archive (libc.a)")
def test_init_is_static(tmp_path: Path) -> None:
    binary = initbin.init_binary(str(tmp_path))
    assert binary is not None
    assert not _has_interpreter(binary)
    _works(binary)


def test_dynamic_when_static_linking_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(initbin, "_STATIC", "-Wl,--corral-no-such-option")
    binary = initbin.init_binary(str(tmp_path))
    assert binary is not None
    assert _has_interpreter(binary)
    _works(binary)
