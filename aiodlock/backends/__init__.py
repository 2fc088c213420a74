"""Backends: each turns "take this name for this owner for this long" into round trips.

The contract a backend implements is :class:`aiodlock.backends._base.Backend`.
"""
