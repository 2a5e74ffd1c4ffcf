"""LazyFork: fork running Linux containers.

``lazyfork.client`` talks to the LazyFork daemon; ``lazyfork.hook`` is the drop-in runtime
hook for workloads that want a say in when they are forked. Both use only the standard
library.
"""

__version__ = "0.1.0"
