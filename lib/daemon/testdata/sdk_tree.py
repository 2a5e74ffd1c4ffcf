"""The SDK's snapshot trees against a real daemon: create, watch from another client,
fork a batch, suspend/resume, protect, rollback, an over-budget refusal, prune.

Prints one JSON report on stdout for the Go test to check.
"""
import json
import sys
import threading
import time

from lazyfork.client import Client, LazyforkError

image, command = sys.argv[1], json.loads(sys.argv[2])
report = {}
c = Client()
tree = c.create_tree(image, command, name="py", label="root", budget={"max_live": 4})
report["tree_id"] = tree.id
report["root_keyframe"] = tree.root.metadata["has_keyframe"]
report["budget"] = tree.budget

seen = []


def watch():
    for m in Client().snapshot_tree("py").watch():
        seen.append(m)


watcher = threading.Thread(target=watch, daemon=True)
watcher.start()
while not seen:
    time.sleep(0.05)

x, y = tree.root.fork(2, labels=["x", "y"])
report["forks"] = [x.id, y.id]
report["fork_labels"] = [x.metadata["label"], y.metadata["label"]]
report["fork_hostname"] = x.exec(["hostname"])["stdout"].strip()
report["suspended"] = x.suspend()["state"]
report["suspended_state"] = x.state
report["resumed"] = x.resume()["state"]
report["resumed_hostname"] = x.exec(["hostname"])["stdout"].strip()
report["protected"] = y.protect()["protected"]
report["unprotected"] = y.unprotect()["protected"]
r = tree.root.rollback(label="again")
report["rollback_parent"] = r.metadata["parent"]
report["nodes"] = [n.id for n in tree.nodes()]

# A lower budget suspends the least recently active unprotected nodes (root, x, y) until
# the tree fits; r, protected, stays live, so a fork of x cannot fit max_live 1.
r.protect()
tree.set_budget(max_live=1)
try:
    x.fork()
except LazyforkError as e:
    report["over_budget"] = [e.code, e.status, e.message]
tree.set_budget(max_live=4)
report["evicted_now"] = tree.evict()

try:
    c.snapshot_tree("nosuch").info()
except LazyforkError as e:
    report["not_found"] = [e.code, e.status]
try:
    c.create_tree(image, command, budget={"max_ram": 1})
except ValueError as e:
    report["bad_budget"] = str(e)

report["pruned_x"] = sorted(x.prune()["pruned"])
report["trees"] = [t.id for t in c.trees()]
res = tree.prune()
report["tree_removed"] = res["tree_removed"]
watcher.join(20)
report["watch_ended"] = not watcher.is_alive()
report["watch_first"] = sorted(seen[0]) if seen else []
report["watch_events"] = [[m["event"]["kind"], m["event"].get("node", ""), m["event"]["latency_ns"]] for m in seen[1:]]
report["trees_after"] = [t.id for t in c.trees()]

# Adopt a running container; drop keeps the state; pruning the dropped root deletes it.
w = c.create(image, command, name="py-adoptee")
t2 = c.adopt_tree("py-adoptee", name="py2", label="adopted")
report["adopted"] = [t2.root.id == w.id, t2.root.metadata["label"]]
d = t2.drop()
report["dropped"] = [bool(d["dir"]), d["tree"]["dropped"], d["suspended"] == [w.id]]
try:
    t2.root.fork()
except LazyforkError as e:
    report["dropped_fork"] = e.code
report["dropped_pruned"] = t2.prune()["tree_removed"]
report["containers_after"] = len(c.list())
print(json.dumps(report))
