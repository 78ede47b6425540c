"""The microvm backend's costs: boot-to-command time and the VMM's own memory.

Each run boots a VM (`MicroVMBackend`, the accel `check()` picks; here TCG,
with `--allow-degraded kvm`) whose command prints the guest's /proc/meminfo
and READY, then sleeps. Measured on the host:

- boot-to-command: from `start()` until READY arrives on the host pipe
  (kernel boot, initramfs, module loading, 9p mounts, setpriv, the shell);
- VMM overhead: QEMU's VmRSS while the guest idles minus the guest memory
  the guest does not report free (RAM given with -m minus MemFree), i.e.
  what QEMU itself holds beyond guest pages (an upper bound: guest pages that
  were touched and freed again count as guest memory here only if free).

Targets are for hardware KVM (<= 300 ms, <= 40 MiB); TCG emulates every
guest instruction, so its figures are printed as TCG figures.

    .venv/bin/python bench/microvm.py [--runs 5]
"""

from __future__ import annotations

import argparse
import os
import select
import shutil
import statistics
import tempfile
import time

from corral.sandbox.backend import MicroVMConfig
from corral.sandbox.microvm.vm import MicroVMBackend
from corral.sandbox.spec import Limits, SandboxSpec

SCRIPT = "head -2 /proc/meminfo; echo READY; sleep 3"


def _rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status", encoding="ascii") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def once(backend: MicroVMBackend, ws: str, guest_mib: int) -> tuple[float, float, str, str]:
    spec = SandboxSpec(
        argv=("/bin/sh", "-c", SCRIPT),
        workspace=ws,
        env=(("PATH", "/usr/bin:/bin"),),
        allow_degraded=frozenset({"kvm"}),
        limits=Limits(memory_bytes=guest_mib << 20, timeout_s=120),
    )
    r, w = os.pipe()
    t0 = time.perf_counter()
    sb = backend.start(spec, stdout_fd=w)
    accel = str(sb.layers["accel"])
    out = b""
    boot = float("nan")
    try:
        while b"READY" not in out:
            ready, _, _ = select.select([r], [], [], 120)
            chunk = os.read(r, 4096) if ready else b""
            if not chunk:
                break
            out += chunk
        boot = time.perf_counter() - t0
        time.sleep(0.5)
        rss_mib = _rss_kib(sb.qemu_pid) / 1024
        res = sb.wait()
    finally:
        sb.close()
        os.close(w)
        os.close(r)
    free_kib = next(int(x.split()[1]) for x in out.decode().splitlines() if x.startswith("MemFree"))
    overhead = rss_mib - (guest_mib - free_kib / 1024)
    return (
        boot,
        overhead,
        f"rss={rss_mib:.0f}MiB free={free_kib / 1024:.0f}MiB exit={res.exit}",
        accel,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--guest-mib", type=int, default=512)
    args = ap.parse_args()
    backend = MicroVMConfig().load()
    assert isinstance(backend, MicroVMBackend)
    ws = tempfile.mkdtemp(prefix="corral-bench-mvm-")
    try:
        once(backend, ws, args.guest_mib)  # warm: derives vmlinux/initramfs, page cache
        boots, overheads = [], []
        accel = ""
        for i in range(args.runs):
            boot, overhead, note, accel = once(backend, ws, args.guest_mib)
            boots.append(boot)
            overheads.append(overhead)
            print(f"run {i + 1}: boot-to-command {boot * 1000:.0f} ms, VMM overhead"
                  f" {overhead:.0f} MiB ({note})")  # fmt: skip
    finally:
        shutil.rmtree(ws, ignore_errors=True)
    print(
        f"{accel.upper()}: boot-to-command median {statistics.median(boots) * 1000:.0f} ms"
        f" (KVM target <= 300 ms); VMM overhead median {statistics.median(overheads):.0f} MiB"
        f" (KVM target <= 40 MiB); guest {args.guest_mib} MiB, {args.runs} runs"
    )


if __name__ == "__main__":
    main()
