"""``python -m services.node_agent``."""

from services.node_agent.cli import main

raise SystemExit(main())
