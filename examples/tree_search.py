#!/usr/bin/env python3
"""Tree search over a running program's state, with the LazyFork Python SDK.

A small program runs in a container: it holds a value (starting at 1) and the moves
made so far in its memory, and applies a move ("+3", "*2", "-1") when asked. The search
wants the value to reach a target: at every level it forks each node of its beam once
per move (one dump per batch), applies the move in each branch, scores the branches by
their distance to the target, keeps the best (the beam) and prunes the losers with
their whole subtrees. The tree's budget allows 4 live containers, so forking evicts
(suspends to disk) the least-recently-active unprotected nodes, and branching from an
evicted beam node resumes it first. At the end the winner is protected and the path to
it is resumed node by node: each program answers from its own memory.

Needs a running daemon (`lazyfork daemon start`) and the default image
(`make image`). Run: python3 examples/tree_search.py [--target 23] [--depth 3]
[--beam 2] [--max-live 4] [--keep]. Exits non-zero if the search did not end with every
node on the winner's path answering with exactly the moves that led to it, or if no
eviction and no resume happened (the budget is meant to force both).
"""

import argparse
import json
import os
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))

from lazyfork.client import Client  # noqa: E402

# The program: SIGUSR1 makes it read /tmp/move, apply it to its state (or just count a
# query for "?"), write its state from memory to /tmp/state.json and remove /tmp/move.
# Between signals it uses no CPU, so last-active is what the search did to it.
PROGRAM = r"""
import json, os, signal
heap = bytearray(4 << 20)
state = {"value": 1, "moves": [], "queries": 0}
def dump():
    open('/tmp/state.tmp', 'w').write(json.dumps(state))
    os.rename('/tmp/state.tmp', '/tmp/state.json')
def step(*_):
    move = open('/tmp/move').read().strip()
    if move == '?':
        state['queries'] += 1
    else:
        n = int(move[1:])
        state['value'] = {'+': state['value'] + n, '*': state['value'] * n, '-': state['value'] - n}[move[0]]
        state['moves'].append(move)
        heap[len(state['moves']) * 4096] = 1  # each branch owns a page of its own
    dump()
    os.unlink('/tmp/move')
signal.signal(signal.SIGUSR1, step)
dump()
while True:
    signal.pause()
"""

ASK = ("echo '%s' > /tmp/move && kill -USR1 1 && for i in $(seq 400); do "
       "[ -e /tmp/move ] || { cat /tmp/state.json; exit 0; }; sleep 0.05; done; echo no answer >&2; exit 1")

MOVES = ["+3", "*2", "-1"]


def ask(node, move):
    """Send a move (or "?") to the node's program and return its state, from its memory."""
    res = node.exec(["sh", "-c", ASK % move], timeout=60)
    if res["exit_code"] != 0:
        raise RuntimeError("node %s did not answer %r: %s" % (node.id, move, res["stderr"].strip()))
    return json.loads(res["stdout"])


def mib(n):
    return "%.1f MiB" % (n / (1 << 20))


class Log:
    """Prints the tree's events as the daemon reports them (one watch connection)."""

    def __init__(self, tree):
        self.counts = {}
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(tree,), daemon=True)
        self.thread.start()
        self.ready.wait(30)

    def _run(self, tree):
        for m in tree.watch():
            if "tree" in m:
                self.ready.set()
                continue
            e = m["event"]
            self.counts[e["kind"]] = self.counts.get(e["kind"], 0) + 1
            what = e.get("node", "")
            if e.get("nodes"):
                what += " -> " + " ".join(e["nodes"])
            print("  event %-8s %s (%.0f ms)" % (e["kind"], what.strip(), e["latency_ns"] / 1e6), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--image", default="lazyfork/debian:bookworm")
    ap.add_argument("--target", type=int, default=23)
    ap.add_argument("--depth", type=int, default=3)
    ap.add_argument("--beam", type=int, default=2)
    ap.add_argument("--max-live", type=int, default=4)
    ap.add_argument("--keep", action="store_true", help="leave the tree (default: prune it at the end)")
    args = ap.parse_args()

    c = Client()
    begin = time.time()
    tree = c.create_tree(args.image, ["python3", "-c", PROGRAM], label="start",
                         budget={"max_live": args.max_live})
    print("tree %s: root %s, budget %s" % (tree.id, tree.root.id, json.dumps(tree.budget)), flush=True)
    log = Log(c.snapshot_tree(tree.id))
    ok = False
    try:
        ok = search(tree, args)
    finally:
        if not args.keep:
            res = tree.prune()
            print("pruned the tree: %d nodes, %s of tmpfs and %s of disk freed" % (
                len(res["pruned"]), mib(res["tmpfs_freed"]), mib(res["disk_freed"])), flush=True)
        log.thread.join(10)
    print("events: %s; %.1f s" % (json.dumps(log.counts, sort_keys=True), time.time() - begin), flush=True)
    if not log.counts.get("evict") or not log.counts.get("resume"):
        print("FAIL: the budget should have forced an eviction and a resume", file=sys.stderr)
        ok = False
    return 0 if ok else 1


def search(tree, args):
    root = tree.root
    expect = {root.id: []}  # the moves each node's program must remember
    score = {}
    beam = [root]
    for level in range(1, args.depth + 1):
        print("level %d: branching from %s" % (level, ", ".join(n.id for n in beam)), flush=True)
        children = []
        for node in beam:
            if node.state == "suspended":
                print("  resume %s (evicted earlier) to branch from it" % node.id, flush=True)
                node.resume()
            kids = node.fork(len(MOVES), labels=[m for m in MOVES])
            for kid, move in zip(kids, MOVES):
                st = ask(kid, move)
                expect[kid.id] = expect[node.id] + [move]
                score[kid.id] = -abs(args.target - st["value"])
                print("  %s %s -> value %d (score %d)" % (kid.id, " ".join(st["moves"]), st["value"], score[kid.id]), flush=True)
                children.append(kid)
        children.sort(key=lambda n: score[n.id], reverse=True)
        beam, losers = children[:args.beam], children[args.beam:]
        for n in losers:
            n.prune()
        u = tree.info()["usage"]
        print("  kept %s, pruned %d; %d nodes, %d live, RAM %s, disk %s" % (
            ", ".join(n.id for n in beam), len(losers), len(tree.doc["nodes"]), u["live"], mib(u["ram_bytes"]), mib(u["disk_bytes"])), flush=True)
    winner = beam[0]
    winner.protect()
    print("winner %s: %s (score %d), protected" % (winner.id, " ".join(expect[winner.id]), score[winner.id]), flush=True)
    # Every branch off the path from the root to the winner goes, with its subtree.
    doc = tree.info()
    path = [winner.id]
    while doc["nodes"][path[-1]].get("parent"):
        path.append(doc["nodes"][path[-1]]["parent"])
    for nid in path:
        for kid in doc["nodes"][nid]["children"]:
            if kid not in path:
                res = tree.node(kid).prune()
                print("  pruned the losing branch %s (%d nodes)" % (kid, len(res["pruned"])), flush=True)

    # The path, each node asked from its own memory (resumed first if it was evicted).
    ok = True
    for nid in reversed(path):
        node = tree.node(nid)
        was = node.state
        if was == "suspended":
            node.resume()
        st = ask(node, "?")
        good = st["moves"] == expect[nid] and st["queries"] >= 1
        ok = ok and good
        print("  %s (%s%s): moves %s value %d %s" % (nid, was, ", resumed" if was == "suspended" else "",
                                                     " ".join(st["moves"]) or "-", st["value"], "ok" if good else "WRONG"), flush=True)
    nodes = tree.info()["nodes"]
    if nodes[winner.id]["state"] != "live" or not nodes[winner.id]["protected"]:
        print("FAIL: the protected winner is %s" % nodes[winner.id]["state"], file=sys.stderr)
        ok = False
    return ok


if __name__ == "__main__":
    sys.exit(main())
