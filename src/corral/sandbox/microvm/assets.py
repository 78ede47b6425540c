"""The guest's kernel and base initramfs: found, derived once, cached by content.

The kernel is a Debian package's, unpacked (`dpkg -x`, by
`scripts/install-microvm-kernel.sh`) into `<cache>/microvm/linux`. QEMU's microvm
machine boots an uncompressed ELF `vmlinux` much faster under TCG than the
package's bzImage (which decompresses itself in emulation), so the xz payload
is decompressed here once. The base initramfs holds Debian's static busybox
and the kernel modules the guest needs (virtio-mmio, virtio-serial, 9p).

Derived files are keyed by a hash of their inputs and trusted only when they
are regular files owned by this user (or root) and writable by nobody else,
like the compiled init; anything else is rebuilt. Inputs (the unpacked
package, busybox) are checked the same way before they are read.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import lzma
import os
import stat
import tempfile
from dataclasses import dataclass

from corral.sandbox.microvm.cpio import Entry, archive
from corral.sandbox.microvm.plan import GUEST_MODULES

__all__ = [
    "BUSYBOX_PATHS",
    "SYSTEM_CACHE",
    "AssetError",
    "Assets",
    "base_entries",
    "find_assets",
    "kernel_dir",
    "module_depends",
]

BUSYBOX_PATHS = ("/usr/bin/busybox", "/bin/busybox")
SYSTEM_CACHE = "/var/cache/corral"
_XZ_MAGIC = b"\xfd7zXZ\x00"


class AssetError(Exception):
    """A guest asset is missing or untrusted (the caller turns it into a layer error)."""


@dataclass(frozen=True, slots=True)
class Assets:
    vmlinux: str
    base_initramfs: str
    kernel_release: str


def kernel_dir(cache: str) -> str:
    return os.path.join(cache, "microvm", "linux")


def _trusted(path: str) -> bool:
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return (
        stat.S_ISREG(st.st_mode)
        and st.st_uid in (0, os.geteuid())
        and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    )


def _read_trusted(path: str) -> bytes:
    if not _trusted(path):
        raise AssetError(f"{path} is missing or writable by others")
    with open(path, "rb") as fh:
        return fh.read()


def module_depends(ko: bytes) -> tuple[str, ...]:
    """The `depends=` list of a kernel module's .modinfo (pure)."""
    i = ko.find(b"\0depends=")
    if i < 0:
        return ()
    end = ko.find(b"\0", i + 1)
    value = ko[i + len(b"\0depends=") : end].decode("ascii", "replace")
    return tuple(d for d in value.split(",") if d)


def decompress_bzimage(bz: bytes) -> bytes:
    """The ELF vmlinux inside an xz-compressed bzImage (Debian's `vmlinuz`)."""
    i = bz.find(_XZ_MAGIC)
    if i < 0:
        raise AssetError("the kernel image has no xz payload")
    dec = lzma.LZMADecompressor(format=lzma.FORMAT_XZ)
    try:
        out = dec.decompress(bz[i:], max_length=512 << 20)
    except lzma.LZMAError as exc:
        raise AssetError(f"cannot decompress the kernel: {exc}") from exc
    if not out.startswith(b"\x7fELF"):
        raise AssetError("the kernel payload is not an ELF image")
    return out


def base_entries(busybox: bytes, modules: dict[str, bytes]) -> list[Entry]:
    """The base initramfs: busybox, the modules, the directory skeleton (pure)."""
    entries = [Entry.dir(d) for d in ("corral", "corral/modules", "proc", "sys", "dev", "tmp")]
    entries += [Entry.dir(d) for d in ("etc", "var", "home", "mnt", "run", "root")]
    # The host's /usr is the guest's; Debian's merged-/usr links complete it.
    entries += [Entry.symlink(n, f"usr/{n}") for n in ("bin", "sbin", "lib", "lib64")]
    entries.append(Entry.file("corral/busybox", busybox, 0o755))
    for name in GUEST_MODULES:
        entries.append(Entry.file(f"corral/modules/{name}.ko", modules[name]))
    return entries


def _write_cached(path: str, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(prefix=".corral-", dir=os.path.dirname(path))
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def find_assets(cache: str) -> Assets:
    """The cached vmlinux and base initramfs, derived now if needed. AssetError if impossible."""
    # The system-wide cache (root's, filled by install-microvm-kernel.sh)
    # serves unprivileged users too; derived files go to the caller's cache.
    kdir = kernel_dir(cache)
    images: list[str] = []
    for kdir in dict.fromkeys((kernel_dir(cache), kernel_dir(SYSTEM_CACHE))):
        images = sorted(glob.glob(os.path.join(kdir, "boot", "vmlinuz-*")))
        if images:
            break
    if not images:
        raise AssetError(
            f"no Debian kernel in {kdir}"
            " (scripts/install-microvm-kernel.sh unpacks linux-image-amd64 there)"
        )
    image = images[-1]
    release = os.path.basename(image)[len("vmlinuz-") :]
    busybox_path = next((p for p in BUSYBOX_PATHS if os.path.exists(p)), None)
    if busybox_path is None:
        raise AssetError("no static busybox (apt-get install busybox-static)")
    out_dir = os.path.join(cache, "microvm")
    os.makedirs(out_dir, mode=0o755, exist_ok=True)
    bz = _read_trusted(image)
    vmlinux = os.path.join(out_dir, f"vmlinux-{hashlib.sha256(bz).hexdigest()[:16]}")
    if not _trusted(vmlinux):
        _write_cached(vmlinux, decompress_bzimage(bz))
    moddir = os.path.join(kdir, "lib", "modules", release, "kernel")
    found: dict[str, str] = {}
    for root, _dirs, files in os.walk(moddir):
        for f in files:
            if f.endswith(".ko") and f[:-3] in GUEST_MODULES:
                found[f[:-3]] = os.path.join(root, f)
    missing = [m for m in GUEST_MODULES if m not in found]
    if missing:
        raise AssetError(f"kernel {release} lacks modules: {', '.join(missing)}")
    modules = {m: _read_trusted(p) for m, p in found.items()}
    for m, ko in modules.items():
        before = GUEST_MODULES[: GUEST_MODULES.index(m)]
        late = [d for d in module_depends(ko) if d not in before]
        if late:
            raise AssetError(f"module {m} needs {', '.join(late)} loaded first")
    busybox = _read_trusted(os.path.realpath(busybox_path))
    data = archive(base_entries(busybox, modules))
    base = os.path.join(out_dir, f"initramfs-{hashlib.sha256(data).hexdigest()[:16]}.cpio")
    if not _trusted(base):
        _write_cached(base, data)
    return Assets(vmlinux, base, release)
