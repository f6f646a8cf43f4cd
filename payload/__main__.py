"""`python -m payload …`: see payload.cli."""

from payload.cli import main

raise SystemExit(main())
