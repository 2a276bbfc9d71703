from workerpool.command import main

raise SystemExit(main())
