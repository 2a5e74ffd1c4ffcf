#!/usr/bin/env python3
"""An "agent" that uses LazyFork's runtime hook (python/lazyfork/hook.py).

It keeps its state in memory (a step counter and every token it has drawn) and draws one
random token per step from a generator seeded with a constant, so two copies of it would
draw the same tokens forever. Forked with LazyFork, each fork continues from the parent's
step with the parent's memory; the RESEED message then reseeds the generator, and from
that line on each fork's tokens differ from its siblings' and its parent's:

    step=41 token=5d2f09a1 memory=41 fork=-
    quiesce step=41                      (the parent, just before the snapshot)
    reseed fork=0c1f.. step=41 memory=41 (in a fork: same step, same memory)
    step=42 token=8e03c7b2 memory=42 fork=0c1f..  (differs in every fork)

Run it inside a container created with --hook (the socket path comes from $LAZYFORK_HOOK):

    lazyfork create lazyfork/debian:bookworm --name agent --hook /run/agent.sock -- \\
        sh -c 'until [ -e /app/examples/agent.py ]; do sleep 0.1; done; exec python3 -u /app/examples/agent.py'
    tar -c examples/agent.py python/lazyfork/hook.py | lazyfork exec agent -- tar -x -C /app
    lazyfork fork agent -n 3
"""

import os
import random
import sys
import threading
import time

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "python"))
from lazyfork.hook import Hook  # noqa: E402

lock = threading.Lock()  # held for a whole step, so QUIESCE lands between steps
state = {"step": 0, "fork": "-"}
memory = []  # the agent's "context": forks inherit it, then each grows its own


def on_quiesce():
    with lock:  # wait for the step in progress to finish
        print("quiesce step=%d" % state["step"], flush=True)


def on_reseed(fork_id):
    # Hook already reseeded `random` from os.urandom; a real agent would also reconnect.
    with lock:
        state["fork"] = fork_id
        print("reseed fork=%s step=%d memory=%d" % (fork_id, state["step"], len(memory)), flush=True)


def main():
    interval = float(os.environ.get("AGENT_INTERVAL", "0.1"))
    hook = Hook(on_quiesce=on_quiesce, on_reseed=on_reseed).start()
    random.seed(1234)
    print("agent up, hook on %s" % hook.path, flush=True)
    while True:
        with lock:
            state["step"] += 1
            token = random.getrandbits(32)
            memory.append(token)
            print("step=%d token=%08x memory=%d fork=%s" % (state["step"], token, len(memory), state["fork"]), flush=True)
        time.sleep(interval)


if __name__ == "__main__":
    main()
