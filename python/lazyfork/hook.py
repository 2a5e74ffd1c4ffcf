"""Drop-in runtime hook for LazyFork (standard library only).

A workload started with ``lazyfork create --hook PATH`` listens on the unix socket PATH
inside its container. LazyFork connects before every snapshot and after every restore:

* ``QUIESCE``     -- a snapshot is about to be taken. Reach a consistent point (finish or
  flush in-flight work, close connections that must not be copied) and answer; the
  snapshot follows right after the answer.
* ``RESEED <id>`` -- this process is a new fork with container id ``<id>``. Reseed random
  generators and reconnect. The default reseeds :mod:`random` from ``os.urandom``.

One connection per message: LazyFork writes one line, the hook answers ``OK`` or
``ERR <reason>`` and closes the connection. This module can be copied next to a program
on its own (it imports nothing else from the lazyfork package)::

    from lazyfork.hook import Hook
    hook = Hook(on_quiesce=flush, on_reseed=lambda fork_id: reconnect()).start()

The socket path defaults to ``$LAZYFORK_HOOK``, which ``lazyfork create --hook`` sets.
"""

import os
import random
import socket
import stat
import threading

__all__ = ["Hook", "serve"]


class Hook:
    """Serves the hook protocol on a unix socket from a daemon thread."""

    def __init__(self, path=None, on_quiesce=None, on_reseed=None, timeout=5.0):
        self.path = path or os.environ.get("LAZYFORK_HOOK")
        if not self.path:
            raise ValueError("no hook socket path: pass path= or create the container with --hook PATH")
        self.on_quiesce = on_quiesce
        self.on_reseed = on_reseed
        self.timeout = timeout
        #: The container id given by the last RESEED (None in the original).
        self.fork_id = None
        #: How many QUIESCE and RESEED messages were handled.
        self.quiesced = 0
        self.reseeded = 0
        self._sock = None
        self._thread = None

    def start(self):
        """Bind the socket and start serving; returns self."""
        directory = os.path.dirname(self.path)
        if directory:
            os.makedirs(directory, exist_ok=True)
        try:
            if stat.S_ISSOCK(os.lstat(self.path).st_mode):
                os.unlink(self.path)  # a stale socket from an earlier run
        except FileNotFoundError:
            pass
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(self.path)
        sock.listen(8)
        self._sock = sock
        self._thread = threading.Thread(target=self._serve, name="lazyfork-hook", daemon=True)
        self._thread.start()
        return self

    def close(self):
        """Stop listening and remove the socket."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None
            try:
                os.unlink(self.path)
            except OSError:
                pass

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.close()

    def _serve(self):
        while True:
            sock = self._sock
            if sock is None:
                return
            try:
                conn, _ = sock.accept()
            except OSError:
                if self._sock is None:
                    return
                continue
            with conn:
                self._handle(conn)

    def _handle(self, conn):
        conn.settimeout(self.timeout)
        try:
            line = b""
            while not line.endswith(b"\n") and len(line) < 4096:
                chunk = conn.recv(4096)
                if not chunk:
                    break
                line += chunk
            verb, _, arg = line.decode("utf-8", "replace").strip().partition(" ")
            if verb == "QUIESCE":
                if self.on_quiesce is not None:
                    self.on_quiesce()
                self.quiesced += 1
            elif verb == "RESEED":
                self.fork_id = arg or None
                random.seed()  # from os.urandom: every fork draws its own numbers
                if self.on_reseed is not None:
                    self.on_reseed(self.fork_id)
                self.reseeded += 1
            else:
                conn.sendall(("ERR unknown message %r\n" % verb).encode())
                return
            conn.sendall(b"OK\n")
        except Exception as e:  # the answer says why; the runtime keeps running
            try:
                reason = ("%s: %s" % (type(e).__name__, e)).replace("\n", " ")
                conn.sendall(("ERR %s\n" % reason).encode())
            except OSError:
                pass


def serve(path=None, on_quiesce=None, on_reseed=None):
    """Start a :class:`Hook` and return it."""
    return Hook(path, on_quiesce=on_quiesce, on_reseed=on_reseed).start()
