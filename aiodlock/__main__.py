from aiodlock.cli import main

raise SystemExit(main())
