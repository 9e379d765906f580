"""The ``kvserve`` command and its tools.

Importing this package turns gRPC's fork support off for the process
(``GRPC_ENABLE_FORK_SUPPORT=false``, unless the operator set it). gRPC reads that variable
when grpc itself is imported, so it must be set before any module imports grpc: every
process of the project starts as the ``kvserve`` command (this package is imported first),
and the test suite imports it first too (``tests/conftest.py``). Why off: gRPC core's fork
handlers can deadlock the forking thread when another thread is inside gRPC at that moment
(seen: the launcher restarting a worker while channels closed hung in ``fork()``), and a
child forked then can abort before it execs (seen: ``redis-server`` started by a test
process dying with SIGABRT on gRPC's poller). Every process here forks only to exec at
once (``subprocess``), which needs none of it.
"""

import os

os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
