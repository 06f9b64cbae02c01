"""``python -m services.projector``: run one projector worker.

Quiet by default; ``QM_PROJECTOR_LOGLEVEL`` (e.g. ``info``) says more.
"""

import faust

from services.runtime import report_config_errors

report_config_errors("projector")
# The app reads its settings when imported: after the hook, so a bad one is one line.
from libs.auth import load_keys  # noqa: E402
from services.metrics_http import MetricsSettings  # noqa: E402
from services.projector import access, trust  # noqa: E402
from services.projector.app import SETTINGS, app  # noqa: E402
from services.projector.usage.agents import signer  # noqa: E402

access.allow(
    load_keys(), frozenset(SETTINGS.clients), frozenset(MetricsSettings.from_env().clients)
)
trust.gate()  # QM_TRUST_FILE: without a good one, nothing could be folded
signer()  # QM_EVENTS_KEY_FILE: the key its usage snapshots are signed with

worker = faust.Worker(app, loglevel=SETTINGS.log_level, quiet=True)
# faust's terminal spinner turns the root logger to DEBUG so that every record
# spins it; in a service that only costs CPU and litters the log with escapes.
worker.spinner = None
worker.execute_from_commandline()
