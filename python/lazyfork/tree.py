"""Snapshot trees through the LazyFork daemon (standard library only).

A snapshot tree is a root container and the forks made from it and from each other,
kept within a budget (live containers, live RAM, disk, chain depth) by suspending the
least-recently-active unprotected nodes to disk. The shape tree search wants: branch at
a decision point, explore each branch, keep the winners, prune the losers::

    from lazyfork.client import Client

    c = Client()
    tree = c.create_tree("lazyfork/debian:bookworm", ["python3", "game.py"],
                         budget={"max_live": 4})
    branches = tree.root.fork(3, labels=["left", "middle", "right"])
    for b in branches:
        b.exec(["sh", "-c", "echo move > /tmp/move"])
    winner = max(branches, key=score)
    winner.protect()
    for b in branches:
        if b is not winner:
            b.prune()
    for message in tree.watch():   # the tree, then one event per mutation
        ...

Every node operation returns what the daemon answered (docs/api.md, "Snapshot trees";
the full answers, with each operation's ``events``, are in ``Tree.last``);
a failure raises :class:`lazyfork.client.LazyforkError` (``over_budget`` when an
operation cannot fit the budget even after eviction).
"""

import json

from .client import _given, _quote

__all__ = ["Tree", "Node", "BUDGET_FIELDS"]

BUDGET_FIELDS = ("max_live", "max_ram_bytes", "max_disk_bytes", "max_chain_depth")


def budget_body(budget):
    """A request's budget: a dict of BUDGET_FIELDS (the others take the default)."""
    if budget is None:
        return None
    unknown = set(budget) - set(BUDGET_FIELDS)
    if unknown:
        raise ValueError("unknown budget field(s) %s: use %s" % (", ".join(sorted(unknown)), ", ".join(BUDGET_FIELDS)))
    return {k: int(v) for k, v in budget.items()}


class Tree:
    """A handle on one snapshot tree (by id, unique id prefix or name)."""

    def __init__(self, client, ref, doc=None):
        self.client = client
        self.ref = ref
        self.doc = doc  # the tree document the daemon last answered
        self.last = None  # the last operation's whole answer (tree, node(s), events, ...)

    def __repr__(self):
        return "Tree(%r)" % (self.ref,)

    def _path(self, verb=""):
        p = "/v1/trees/" + _quote(self.ref)
        return p + "/" + verb if verb else p

    def _keep(self, res):
        self.last = res
        if res and res.get("tree"):
            self.doc = res["tree"]
        return res

    def info(self):
        """The tree document, its figures measured now: budget, usage, nodes."""
        self.doc = self.client.request("GET", self._path())
        return self.doc

    def _doc(self):
        return self.doc if self.doc is not None else self.info()

    @property
    def id(self):
        return self._doc()["id"]

    @property
    def root(self):
        """The root node."""
        d = self._doc()
        return Node(self, d["root"], d["nodes"].get(d["root"]))

    @property
    def budget(self):
        return self._doc()["budget"]

    @property
    def usage(self):
        return self._doc()["usage"]

    def nodes(self):
        """Every node (handles with their metadata), oldest (the root) first."""
        return [Node(self, n["id"], n) for n in self.client.request("GET", self._path("nodes"))]

    def node(self, ref):
        """A handle on a node: its id, its container's name or a unique id prefix."""
        return Node(self, ref)

    def evict(self):
        """Run the budget's eviction now; returns the ids of the nodes it suspended."""
        return self._keep(self.client.request("POST", self._path("evict"))).get("suspended") or []

    def set_budget(self, **fields):
        """Change the given budget fields (max_live=..., max_ram_bytes=...); evicts what the
        new budget asks for. Returns {"tree": ..., "events": [...]} (evictions included)."""
        return self._keep(self.client.request("POST", self._path("budget"), budget_body(fields)))

    def drop(self):
        """Forget the tree: live nodes are suspended to disk; returns {"suspended": [...],
        "dir": where the state stays, "tree": ...}."""
        return self._keep(self.client.request("DELETE", self._path()))

    def prune(self):
        """Prune the root: every node, and the tree with it."""
        return self.root.prune()

    def watch(self):
        """Yield {"tree": doc} (the tree as it is), then {"event": {...}} for each mutation:
        kind, node, nodes, latency_ns, time, seq, and external (true for a mutation another
        process made, e.g. `lazyfork --local tree ...`, seen by the daemon in tree.json;
        latency_ns is then 0). Ends when the tree's root is pruned."""
        conn, resp = self.client._open("GET", self._path("watch"))
        try:
            while True:
                line = resp.readline()
                if not line:
                    from .client import LazyforkError
                    raise LazyforkError("failed", "watch of tree %s: the daemon closed the stream" % self.ref)
                line = line.strip()
                if not line:
                    continue
                m = json.loads(line)
                if m.get("end") == "removed":
                    return
                if m.get("end") or m.get("error"):
                    from .client import LazyforkError
                    err = m.get("error") or {"code": "failed", "message": "the daemon ended the stream (%s)" % m["end"]}
                    raise LazyforkError(err["code"], err["message"])
                if m.get("tree"):
                    self.doc = m["tree"]
                yield m
        finally:
            conn.close()


class Node:
    """A handle on one node of a tree."""

    def __init__(self, tree, ref, info=None):
        self.tree = tree
        self.client = tree.client
        self.ref = ref
        self._info = info

    def __repr__(self):
        return "Node(%r)" % (self.ref,)

    def __eq__(self, other):
        return isinstance(other, Node) and self.id == other.id

    def __hash__(self):
        return hash(self.id)

    def _path(self, verb=""):
        p = self.tree._path("nodes/" + _quote(self.ref))
        return p + "/" + verb if verb else p

    def _op(self, method, verb, body=None):
        res = self.tree._keep(self.client.request(method, self._path(verb), body))
        if res.get("node"):
            self._info = res["node"]
        return res

    @property
    def id(self):
        return self.metadata["id"]

    @property
    def metadata(self):
        """The node's metadata as last answered (asked once if unknown)."""
        if self._info is None:
            self.info()
        return self._info

    def info(self):
        """The node's metadata measured now: state, label, ram_bytes, disk_bytes,
        dirty_pages, has_keyframe, last_active, protected, children, ..."""
        self._info = self.client.request("GET", self._path())
        return self._info

    @property
    def state(self):
        return self.info()["state"]

    @property
    def kind(self):
        """"container", or "cluster" (containers sharing one network namespace, forked,
        suspended and resumed as one cut; see members)."""
        return self.metadata.get("kind", "container")

    @property
    def container(self):
        """The node's container (exec, logs, stats); a cluster's leader."""
        return self.client.container(self.id)

    @property
    def members(self):
        """The node's containers: the container itself, or a cluster's members, leader
        first."""
        ids = self.metadata.get("member_ids") or [self.id]
        return [self.client.container(i) for i in ids]

    def exec(self, argv, **kw):
        """Run a command inside the node's container (Container.exec)."""
        return self.container.exec(argv, **kw)

    def fork(self, n=1, names=None, labels=None):
        """Fork ``n`` branches (one dump for the batch); returns their Node handles."""
        body = _given({"n": n}, names=list(names) if names else None, labels=list(labels) if labels else None)
        res = self._op("POST", "fork", body)
        return [Node(self.tree, k["id"], k) for k in res["nodes"]]

    def prepare(self, refresh=False):
        """Write the node's keyframe now (idempotent); refresh writes a new generation."""
        return self._op("POST", "prepare", {"refresh": True} if refresh else None)["node"]

    def rollback(self, name=None, label=None):
        """A new branch from this node's keyframe (its earlier state); returns its Node."""
        body = _given({}, name=name or None, label=label or None)
        res = self.tree._keep(self.client.request("POST", self._path("rollback"), body))
        return Node(self.tree, res["node"]["id"], res["node"])

    def suspend(self):
        """Write the node's state to disk and free its RAM."""
        return self._op("POST", "suspend")["node"]

    def resume(self):
        """Restore a suspended node in place (same id and name, its whole delta applied)."""
        return self._op("POST", "resume")["node"]

    def protect(self):
        """Exclude the node from eviction."""
        return self._op("POST", "protect")["node"]

    def unprotect(self):
        return self._op("POST", "unprotect")["node"]

    def prune(self):
        """Delete the node and its whole subtree; returns {"pruned": [...],
        "tmpfs_freed": ..., "disk_freed": ..., "tree_removed": ...}."""
        return self.tree._keep(self.client.request("DELETE", self._path()))
