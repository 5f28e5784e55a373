"""``python -m distlab``: the same as the ``distlab`` command (`distlab.cli`)."""

from distlab.cli import main

raise SystemExit(main())
