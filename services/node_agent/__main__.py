"""``python -m services.node_agent``."""

import os

# The agent forks a process per task while its gRPC server (task logs) has threads: a
# forked child only execs, never touches gRPC, so gRPC's fork handlers (on by default in
# grpcio, which then skips them while calls are under way and says so per fork) are
# off. Read when grpc is first imported: before the agent's modules.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

from services.node_agent.cli import main

raise SystemExit(main())
