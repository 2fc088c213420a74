from benchmarks.runner import main

raise SystemExit(main())
