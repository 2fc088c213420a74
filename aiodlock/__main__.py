"""``python -m aiodlock``: the command line (see :mod:`aiodlock.cli`)."""

from aiodlock.cli import main

raise SystemExit(main())
