from tandemctl.cli import main

raise SystemExit(main())
