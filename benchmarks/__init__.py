"""Benchmarks of aiodlock against the raw Redis floor and peer libraries.

Run everything (one fresh redis-server on a free loopback port, every workload, every
adapter, one run)::

    python -m benchmarks --name full

See ``docs/benchmarks.md`` for the workloads, the targets and the latest numbers.
"""
