"""``mysql://`` / ``mariadb://``: locks in a MySQL or MariaDB database (see ``backend``)."""

from .backend import MySQLBackend

__all__ = ["MySQLBackend"]
