# The benchmark's workload: a Python "agent" holding a heap of argv[1] MiB of
# incompressible bytes. Every second it reads 32 random pages and writes one, as the
# spec's benchmark does. bench.py runs it with `python3 -c` as the container's pid 1.
# With argv[2] == "idle" it only holds the heap (the "idle fork" of the targets).
#
# The source container (the one that keeps its hostname: forks get new ones before they
# resume) also wakes every 20 ms and records the longest gap between two wake-ups, in
# wall-clock time, to /tmp/lf-pause: that is how long a dump or `fork --share` stopped it.
# Every gap over 10 ms is also appended to /tmp/lf-pauses ("END_UNIX_S GAP_MS" a line), so
# the benchmark can tell the pause of each fork by its time. /tmp/lf-ready appears once the
# heap is filled: after a swap its pages are in memory files the agent has not touched
# since, so its resident size no longer says so.
# Short sleeps keep the figure honest across a restore, where CRIU's time namespace shifts
# the monotonic clock a sleep runs on; a fork switches to one wake-up a second. The
# page work is timed on the monotonic clock, which a restore continues where the dump
# left it: a fork does its next round within a second of resuming, as a plain sleep(1)
# loop would, not all at once to catch up.
import os
import random
import socket
import sys
import time

mb = int(sys.argv[1]) if len(sys.argv) > 1 else 128
idle = len(sys.argv) > 2 and sys.argv[2] == "idle"  # hold the heap, touch nothing
PAGE = 4096
STEP = 0.02
chunk = os.urandom(1 << 20)
heap = bytearray(chunk) * mb  # every page present and distinct from zero
del chunk
npages = len(heap) // PAGE
try:  # the heap is filled: the benchmark may look (its resident size can say less, below)
    with open("/tmp/lf-ready", "w") as f:
        f.write("%d\n" % mb)
except OSError:
    pass
while idle:
    time.sleep(1)
host = socket.gethostname()
source = True
tick = 0
worst = 0.0
last = time.time()
next_work = time.monotonic()
while True:
    now = time.time()
    if source and socket.gethostname() != host:
        source = False  # a fork: no heartbeat, no pause file
        random.seed()  # its own pages to read, as CPython reseeds random in an os.fork() child
    if source:
        gap = now - last - STEP
        if gap > 0.01:
            with open("/tmp/lf-pauses", "a") as f:
                f.write("%.3f %.1f\n" % (now, gap * 1000))
        if gap > 0.02 and gap > worst:
            worst = gap
            with open("/tmp/lf-pause", "w") as f:
                f.write("%.1f\n" % (gap * 1000))
    last = now
    mono = time.monotonic()
    if mono >= next_work:
        s = 0
        for _ in range(32):
            s += heap[random.randrange(npages) * PAGE]
        heap[random.randrange(npages) * PAGE] = (tick + s) & 0xFF
        tick += 1
        next_work = mono + 1.0
    time.sleep(STEP if source else max(0.0, next_work - time.monotonic()))
