"""Python client of the LazyFork daemon (standard library only).

The daemon (``lazyfork daemon run`` or ``lazyfork daemon start``) serves an HTTP/JSON API on
a unix socket; this module speaks it (docs/api.md in the repository lists every route)::

    from lazyfork.client import Client

    agent = Client().container("agent")
    with agent.fork(10) as forks:
        outputs = [f.exec(["hostname"])["stdout"] for f in forks]
        grandchildren = forks[0].fork(3)

Snapshot trees (budgets, eviction, suspend/resume, protect/prune, watch) are
``create_tree``, ``adopt_tree``, ``trees`` and ``snapshot_tree`` (see ``lazyfork.tree``).

``fork`` returns a :class:`Forks` list; used as a context manager it deletes its forks on
exit (their own forks keep running). Every failure raises :class:`LazyforkError` with the
daemon's stable ``code`` and its message.
"""

import base64
import http.client
import json
import os
import socket
import urllib.parse

__all__ = ["Client", "Container", "Forks", "LazyforkError", "DEFAULT_SOCKET"]

DEFAULT_SOCKET = "/run/lazyfork/lazyfork.sock"


class LazyforkError(Exception):
    """An error answered by the daemon (or the socket not answering)."""

    def __init__(self, code, message, status=None):
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status

    def __str__(self):
        return "%s: %s" % (self.code, self.message)


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path, timeout=None):
        super().__init__("lazyfork", timeout=timeout)
        self._path = path

    def connect(self):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        if self.timeout is not None:
            sock.settimeout(self.timeout)
        sock.connect(self._path)
        self.sock = sock


def _quote(ref):
    return urllib.parse.quote(str(ref), safe="")


def _given(body, **fields):
    """``body`` plus the fields the caller gave, in order: None (not given) and False (a
    flag left off) are left out, so the daemon's defaults stand."""
    body.update((k, v) for k, v in fields.items() if v is not None and v is not False)
    return body


def _opt(convert, v):
    """convert(v), or None when v was not given."""
    return None if v is None else convert(v)


def _env_list(env):
    if env is None:
        return None
    if isinstance(env, dict):
        return ["%s=%s" % (k, v) for k, v in env.items()]
    return list(env)


class Client:
    """A connection to one daemon.

    ``socket_path`` defaults to ``$LAZYFORK_SOCKET``, then ``/run/lazyfork/lazyfork.sock``.
    ``timeout`` (seconds) bounds each request; the default waits as long as an
    operation takes (a fork of many copies can take seconds).
    """

    def __init__(self, socket_path=None, timeout=None):
        self.socket_path = socket_path or os.environ.get("LAZYFORK_SOCKET") or DEFAULT_SOCKET
        self.timeout = timeout

    # -- plumbing -----------------------------------------------------------------

    def _open(self, method, path, body=None):
        conn = _UnixConnection(self.socket_path, timeout=self.timeout)
        headers = {}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        try:
            conn.request(method, path, body=data, headers=headers)
            resp = conn.getresponse()
        except (FileNotFoundError, ConnectionRefusedError) as e:
            conn.close()
            raise LazyforkError(
                "daemon_unreachable",
                "no LazyFork daemon answers on %s (start one with `lazyfork daemon start`): %s" % (self.socket_path, e),
            ) from None
        except BaseException:
            conn.close()
            raise
        if resp.status >= 300:
            raw = resp.read()
            conn.close()
            try:
                err = json.loads(raw)
                raise LazyforkError(err["code"], err["message"], resp.status)
            except (ValueError, KeyError, TypeError):
                raise LazyforkError("failed", "daemon answered %d: %s" % (resp.status, raw[:500]), resp.status) from None
        return conn, resp

    def request(self, method, path, body=None):
        """Send one request and return the decoded JSON answer (None for 204)."""
        conn, resp = self._open(method, path, body)
        try:
            raw = resp.read()
        finally:
            conn.close()
        if resp.status == 204 or not raw:
            return None
        return json.loads(raw)

    # -- daemon and host ----------------------------------------------------------

    def ping(self):
        """The daemon's version, pid, socket and state directories."""
        return self.request("GET", "/v1/ping")

    def status(self):
        """Host facts, container totals and the daemon."""
        return self.request("GET", "/v1/status")

    def gc(self):
        """Remove memory files, layers and snapshots nothing references any more."""
        self.request("POST", "/v1/gc")

    def clean(self):
        """Delete every stopped or exited container; returns their ids."""
        return self.request("POST", "/v1/clean")["deleted"]

    def events(self):
        """Yield lifecycle events (dicts with type, id, name, parent, time) as they happen."""
        conn, resp = self._open("GET", "/v1/events")
        try:
            while True:
                line = resp.readline()
                if not line:
                    return
                line = line.strip()
                if line:
                    yield json.loads(line)
        finally:
            conn.close()

    # -- containers ---------------------------------------------------------------

    def container(self, ref):
        """A handle on a container by name, id or unique id prefix (nothing is asked yet)."""
        return Container(self, ref)

    def create(self, image, command=None, name=None, env=None, hook=None,
               user=None, memory=None, pids_limit=None, privileged=False,
               net=None, nat=False, join=None):
        """Create and start a container; returns its handle. memory is in bytes;
        privileged=True opts out of confinement (docs/security.md). net is "none"
        (default), "bridge" (an address on the LazyFork bridge: ``address``) or "host";
        nat=True masquerades a bridge container's traffic to the host's other networks.
        join names a running --net none or bridge container whose network namespace
        (and address) the new one shares: a cluster, forked as one cut with
        :meth:`Container.cluster_fork`; leave net and nat out, a member takes its
        cluster's."""
        body = _given({"image": image}, user=user, memory=_opt(int, memory), pids_limit=_opt(int, pids_limit),
                      privileged=bool(privileged), net=net or None, nat=bool(nat), join=join or None,
                      command=_opt(list, command), name=name, env=_env_list(env), hook=hook)
        info = self.request("POST", "/v1/containers", body)
        return Container(self, info["id"], info)

    def list(self):
        """Every container's live view (dicts: id, name, state, parent, depth, pid, ...)."""
        return self.request("GET", "/v1/containers")

    def tree(self):
        """The containers as a forest: each dict has its forks under "children"."""
        return self.request("GET", "/v1/tree")

    # -- snapshot trees (lazyfork.tree) ----------------------------------------------

    def create_tree(self, image, command=None, name=None, root_name=None, label=None, budget=None, ksm=False,
                    env=None, **create):
        """Create a snapshot tree rooted at a new container (the arguments of create());
        its keyframe is written at once. ``budget`` is a dict of max_live, max_ram_bytes,
        max_disk_bytes, max_chain_depth (the others take the default). Returns a Tree."""
        root = _given({"image": image}, command=_opt(list, command), name=root_name, env=_env_list(env))
        root.update(create)
        return self._new_tree({"root": root}, name, label, budget, ksm)

    def adopt_tree(self, ref, name=None, label=None, budget=None, ksm=False):
        """Create a snapshot tree rooted at running container ``ref``; a cluster member
        roots it at its whole cluster (a node of kind "cluster"). Returns a Tree."""
        return self._new_tree({"adopt": ref}, name, label, budget, ksm)

    def _new_tree(self, body, name, label, budget, ksm):
        from .tree import Tree, budget_body
        _given(body, name=name, label=label, budget=_opt(budget_body, budget), ksm=bool(ksm))
        doc = self.request("POST", "/v1/trees", body)
        return Tree(self, doc["id"], doc)

    def trees(self):
        """Every snapshot tree (Tree handles carrying their documents), oldest first."""
        from .tree import Tree
        return [Tree(self, d["id"], d) for d in self.request("GET", "/v1/trees")]

    def snapshot_tree(self, ref):
        """A handle on a snapshot tree by id, unique id prefix or name."""
        from .tree import Tree
        return Tree(self, ref)

    def stats(self, ref):
        """Memory, snapshot and timing figures of one container."""
        return self.container(ref).stats()

    def delete(self, ref):
        """Delete a container; its forks keep running."""
        self.container(ref).delete()


class Container:
    """A handle on one container."""

    def __init__(self, client, ref, info=None):
        self.client = client
        self.ref = ref
        self._info = info

    def __repr__(self):
        return "Container(%r)" % (self.ref,)

    def _path(self, verb=""):
        p = "/v1/containers/" + _quote(self.ref)
        return p + "/" + verb if verb else p

    @property
    def id(self):
        """The container's id (asked once if the handle was made from a name)."""
        if self._info is None:
            self._info = self.info()
        return self._info["id"]

    @property
    def name(self):
        if self._info is None:
            self._info = self.info()
        return self._info.get("name")

    def info(self):
        """The live view: id, name, state, parent, depth, pid, procs, memory_bytes, net,
        address (bridge mode), ..."""
        self._info = self.client.request("GET", self._path())
        return self._info

    @property
    def address(self):
        """The container's IPv4 address in bridge mode (None in the other modes)."""
        return self.info().get("address")

    def fork(self, n=1, names=None, force=False, share=False, hook_force=False, hook_timeout=None, huge_pages=None,
             copy=False):
        """Make ``n`` running copies; returns :class:`Forks` (a list of handles).

        ``huge_pages`` puts each dense 2 MiB stretch of the heap's memory files in one
        huge page: each working fork costs ~0.4 MB less (256 MiB heap). None (default): a
        running container's first fork does it before the freeze, a copy does not (it
        slows the rewrite); True: both; False: neither."""
        body = _given({"n": n}, names=list(names) if names else None, force=bool(force), share=bool(share),
                      copy=bool(copy), hook_force=bool(hook_force), hook_timeout=hook_timeout)
        if huge_pages is not None:
            body["huge_pages"] = bool(huge_pages)  # False too (_given leaves False out)
        res = self.client.request("POST", self._path("fork"), body)
        return Forks(Container(self.client, f["id"], {"id": f["id"], "name": f.get("name")}) for f in res["forks"])

    def cluster_fork(self, n=1, force=False):
        """Fork every member of this container's cluster as one cut, ``n`` times. Returns
        the result: ``members`` (each with ``pause_ms`` and its copy in each fork under
        ``forks``) and ``leaders`` (the new clusters)."""
        return self.client.request("POST", self._path("cluster-fork"), _given({"n": n}, force=bool(force)))

    def exec(self, argv, stdin=None, env=None, cwd=None, timeout=None):
        """Run a command inside; returns {"stdout": str, "stderr": str, "exit_code": int}."""
        if isinstance(argv, str):
            raise TypeError("argv must be a list of strings, e.g. ['sh', '-c', %r]" % argv)
        body = {"argv": list(argv)}
        if isinstance(stdin, (bytes, bytearray)):
            body["stdin_base64"] = base64.b64encode(bytes(stdin)).decode()
        elif stdin is not None:
            body["stdin"] = stdin
        _given(body, env=_env_list(env), cwd=cwd, timeout=timeout)
        return self.client.request("POST", self._path("exec"), body)

    def stop(self, hook_force=False, hook_timeout=None):
        """Snapshot and end the processes; it stays forkable and can be started again."""
        body = _given({}, hook_force=bool(hook_force), hook_timeout=hook_timeout)
        self._info = self.client.request("POST", self._path("stop"), body)
        return self._info

    def start(self):
        """Restart a stopped container from its snapshot."""
        self._info = self.client.request("POST", self._path("start"))
        return self._info

    def freeze(self):
        self._info = self.client.request("POST", self._path("freeze"))
        return self._info

    def thaw(self):
        self._info = self.client.request("POST", self._path("thaw"))
        return self._info

    def delete(self):
        """Delete the container; its forks keep running."""
        self.client.request("DELETE", self._path())

    def stats(self):
        """Memory (cgroup), family memory, snapshot and timing figures."""
        return self.client.request("GET", self._path("stats"))

    def logs(self):
        """The container's output so far (stdout and stderr of its command)."""
        conn, resp = self.client._open("GET", self._path("logs"))
        try:
            return resp.read().decode("utf-8", "replace")
        finally:
            conn.close()


class Forks(list):
    """The handles of a fork's copies. As a context manager it deletes them on exit."""

    def delete(self):
        """Delete every fork (ones already gone are skipped)."""
        errors = []
        for f in self:
            try:
                f.delete()
            except LazyforkError as e:
                if e.code != "not_found":
                    errors.append(e)
        if errors:
            raise errors[0]

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.delete()
        return False
