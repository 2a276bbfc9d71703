from workerpool.cli import main

raise SystemExit(main())
