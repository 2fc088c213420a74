"""Benchmarks of aiodlock against the raw Redis floor and peer libraries.

Run everything (one fresh redis-server on a free loopback port, every workload, every
adapter, one run)::

    python -m benchmarks --name full

See ``docs/benchmarks.md`` for the workloads, the targets and the latest numbers.
"""

import os

# (servers are forked with a preexec_fn; gRPC's fork support can abort such a child: see
# tests/conftest.py)
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
