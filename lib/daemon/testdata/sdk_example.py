"""The spec's SDK example, end to end against a real daemon, plus the rest of the SDK.

Prints one JSON report on stdout for the Go test to check.
"""
import json
import threading
import time

from lazyfork.client import Client, LazyforkError

report = {}

# --- the spec's example, verbatim ---
agent = Client().container("agent")
with agent.fork(10) as forks:
    outputs = [f.exec(["hostname"])["stdout"] for f in forks]
    grandchildren = forks[0].fork(3)
    # --- what the test checks inside the block ---
    report["fork_ids"] = [f.id for f in forks]
    report["outputs"] = outputs
    report["grandchildren"] = [g.info() for g in grandchildren]
    report["grandchild_hostnames"] = [g.exec(["hostname"])["stdout"] for g in grandchildren]

c = Client()
report["after_with"] = c.list()

# --- the rest of the SDK ---
try:
    c.container("no-such-container").info()
except LazyforkError as e:
    report["not_found"] = [e.code, e.status]
try:
    agent.exec("hostname")
except TypeError as e:
    report["argv_str"] = str(e)
report["stdin"] = agent.exec(["cat"], stdin=b"bin\x01ary")["stdout"]
report["exit_code"] = agent.exec(["sh", "-c", "exit 7"])["exit_code"]

seen = []


def watch():
    for e in Client().events():
        seen.append(e["type"])
        if len(seen) >= 4:
            return


watcher = threading.Thread(target=watch, daemon=True)
watcher.start()
time.sleep(0.3)  # subscribed

w = c.create("lazyfork/debian:bookworm", ["sleep", "1000"], name="sdk-made", env={"A": "from-sdk"})
report["env"] = w.exec(["sh", "-c", "echo $A"])["stdout"]
report["stats_state"] = w.stats()["state"]
report["stopped"] = w.stop()["state"]
report["started"] = w.start()["state"]
w.delete()
watcher.join(10)
report["events"] = seen
report["names_after_delete"] = sorted(x.get("name", "") for x in c.list())
for g in grandchildren:
    g.delete()
report["final_count"] = len(c.list())
print(json.dumps(report))
