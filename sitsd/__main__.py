from .daemon_main import main

raise SystemExit(main())
