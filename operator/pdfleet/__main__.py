from pdfleet.cli.main import main

raise SystemExit(main())
