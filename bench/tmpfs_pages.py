#!/usr/bin/env python3
"""How fast fresh tmpfs pages are on this machine, small and huge (docs/how-it-works.md,
section 11): what the memory files' page size costs a rewrite.

    flock /tmp/lazyfork-bench.lock python3 bench/tmpfs_pages.py [--mib 256] [--idle 0,0.5,2,5,10]

Two tmpfs mounts of its own (huge=never, huge=always) in a temporary directory. For each
kind, a file of --mib MiB is written in 2 MiB writes (a huge=always tmpfs puts each in
one huge page), deleted, and written again after each --idle pause: on a VM whose balloon
reports free memory to the host (virtio free page reporting), memory freed a moment ago
is fast and memory reported since costs host faults. Prints ms per write; unmounts on exit.
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHUNK = 2 << 20


def fill(path, mib, buf):
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        t = time.perf_counter()
        for off in range(0, mib << 20, CHUNK):
            os.pwrite(fd, buf, off)
        return (time.perf_counter() - t) * 1000
    finally:
        os.close(fd)


def shmem_huge_kib():
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("ShmemHugePages:"):
            return int(line.split()[1])
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--idle", default="0,0.5,2,5,10", help="s between freeing and writing again, comma-separated")
    a = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("tmpfs_pages: must run as root (it mounts two tmpfs)")
    idles = [float(x) for x in a.idle.split(",") if x]
    buf = os.urandom(CHUNK)
    top = Path(tempfile.mkdtemp(prefix="lfbench-tmpfs-"))
    mounted = []
    try:
        for kind in ("never", "always"):
            d = top / kind
            d.mkdir()
            subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={2 * a.mib + 64}m,huge={kind}", "tmpfs", str(d)],
                           check=True)
            mounted.append(d)
        for d in mounted:
            kind = "huge pages" if d.name == "always" else "4 KiB pages"
            f = d / "f"
            h0 = shmem_huge_kib()
            first = fill(f, a.mib, buf)
            huge = shmem_huge_kib() - h0
            f.unlink()
            print(f"{kind:11}: {a.mib} MiB written in {first:.0f} ms (fresh; {huge >> 10} MiB in huge pages)", flush=True)
            for s in idles:
                time.sleep(s)
                ms = fill(f, a.mib, buf)
                f.unlink()
                print(f"{kind:11}: again {s:4.1f} s after freeing the last: {ms:.0f} ms", flush=True)
    finally:
        for d in mounted:
            subprocess.run(["umount", str(d)], check=False)
        for d in mounted:
            d.rmdir()
        top.rmdir()


if __name__ == "__main__":
    main()
