#!/usr/bin/env python3
"""What a fresh namespace of each kind costs the machine, made and freed K times.

    bench/ns_cost.py [-k 200]

For each kind a fork gets (net, ipc, uts, mnt, pid; and net with loopback brought up, as
lf-restore gives a `--net none` fork), K threads one after the other each unshare(2) a new
namespace of that kind and exit, which frees it. Printed per namespace: wall time, the CPU
of this process (making it, and freeing it where the exiting thread does), and the CPU of
the whole machine (/proc/stat), which also counts what the kernel frees later in its own
workers (a network namespace's cleanup_net). Root only. Every figure is a measurement of
this host, never a target: run it alone (`flock /tmp/lazyfork-bench.lock bench/ns_cost.py`).
"""
import argparse
import ctypes
import os
import resource
import socket
import struct
import threading
import time

FLAGS = {"net": 0x40000000, "ipc": 0x08000000, "uts": 0x04000000, "mnt": 0x00020000, "pid": 0x20000000}
libc = ctypes.CDLL(None, use_errno=True)
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1


def busy_jiffies():
    f = [int(x) for x in open("/proc/stat").readline().split()[1:]]
    return sum(f) - f[3] - f[4]  # all but idle and iowait


def lo_up():
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        req = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", __import__("fcntl").ioctl(s, SIOCGIFFLAGS, req))[1]
        __import__("fcntl").ioctl(s, SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | IFF_UP))


def one(flag, up, errs):
    if flag == FLAGS["mnt"]:
        libc.unshare(0x00000200)  # CLONE_FS first: a thread shares its fs with the process
    if libc.unshare(flag) != 0:
        errs.append(os.strerror(ctypes.get_errno()))
        return
    if up:
        lo_up()
    if flag == FLAGS["pid"]:
        # A pid namespace exists once its first process does: fork one that exits at once.
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)


def measure(name, flag, up, k):
    errs = []
    hz = os.sysconf("SC_CLK_TCK")
    ru0, j0, t0 = resource.getrusage(resource.RUSAGE_SELF), busy_jiffies(), time.monotonic()
    for _ in range(k):
        t = threading.Thread(target=one, args=(flag, up, errs))
        t.start()
        t.join()
    time.sleep(1.0)  # let the kernel's workers finish freeing (cleanup_net)
    ru1, j1, t1 = resource.getrusage(resource.RUSAGE_SELF), busy_jiffies(), time.monotonic()
    if errs:
        raise SystemExit(f"{name}: unshare failed: {errs[0]}")
    cpu = (ru1.ru_utime - ru0.ru_utime + ru1.ru_stime - ru0.ru_stime) * 1000 / k
    machine = (j1 - j0) * 1000 / hz / k
    print(f"{name:10s} wall {(t1 - t0 - 1.0) * 1000 / k:6.3f} ms, this process {cpu:6.3f} ms CPU, "
          f"machine {machine:6.3f} ms CPU (incl. 1 s of everything else, /{k})", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-k", type=int, default=200)
    a = ap.parse_args()
    measure("nothing", 0, False, a.k)
    for name, flag in FLAGS.items():
        measure(name, flag, False, a.k)
    measure("net+lo up", FLAGS["net"], True, a.k)


if __name__ == "__main__":
    main()
