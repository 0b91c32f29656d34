from hivejobs.cli import main

raise SystemExit(main())
