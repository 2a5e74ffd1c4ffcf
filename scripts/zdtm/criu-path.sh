#!/bin/bash
# The CRIU binary LazyFork runs (lib/criu's order: $LAZYFORK_CRIU, the private one, Debian's).
for c in "${LAZYFORK_CRIU:-}" /usr/local/lib/lazyfork/criu/bin/criu /usr/sbin/criu; do
	[ -n "$c" ] && [ -x "$c" ] && { echo "$c"; exit 0; }
done
echo "no criu found" >&2
exit 1
