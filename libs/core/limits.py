"""The protocol's limits on what a job, a node and a budget tree may be: declared once.

Admission enforces them at the edge (``INVALID_ARGUMENT`` naming the field), and the
scheduler again on every input it reads (a rejection, never an exception), because a
record can reach the log without passing admission. Together they bound every record a
service writes: the largest legal job, placed, planned or rejected, still fits the bus's
record limit (``tests/unit/libs/events/test_record_sizes.py`` builds it and checks).

A site narrows them further with ``validation.Limits`` (64 GPUs a job, an 8 h contract).
"""

from __future__ import annotations

KIB = 1024
DAY_S = 86_400

# The largest record a service may write. Kafka's default limit is 1 MiB; the
# headroom is for the envelope and record headers around a payload.
MAX_RECORD_BYTES = 1_000_000
# An encoded JobSpec: placement copies it into every TaskPlaced and the projector
# into the job's read model, so it must leave room for what goes around it.
MAX_SPEC_BYTES = 512 * KIB

MAX_NAME_CHARS = 64  # ids that repeat per task: job, task and node ids, parents
MAX_ADDRESS_CHARS = 253  # a node's address: a DNS name at most
MAX_TEXT_CHARS = 128  # allocation, user, GPU type, cluster, request id, model, workflow name

MAX_GPUS = 1024  # per job, however large the site
MAX_GANG_NODES = 128  # nodes one job may span
MAX_COMMAND_ARGS = 1024
MAX_COMMAND_BYTES = 64 * KIB
MAX_ENV_VARS = 256
MAX_ENV_BYTES = 64 * KIB
MAX_SECRETS = 64  # secret names a job may ask the node agent for
MAX_SIMULATED_DURATION_S = 366 * DAY_S
MAX_RUNTIME_ESTIMATE_S = 366 * DAY_S
MAX_TIME_LIMIT_S = 366 * DAY_S
MAX_DEPENDENCIES = 1024  # jobs one job waits for (--after): an array's elements count each
MAX_ARRAY_ELEMENTS = 1000  # jobs one job array holds (qm submit --array)
MAX_ARRAY_INDEX = 999_999
MAX_MOUNTS = 32  # declared volumes one job mounts
MAX_PATH_CHARS = 4096  # a path in a job's container, or its working directory
MAX_IMAGE_CHARS = 255  # an image reference, as registries allow
MAX_GPU_MEMORY_GIB = 4096.0

MAX_WORKFLOW_TASKS = 4096
MAX_WORKFLOW_EDGES = 32_768  # parent links over all tasks
MAX_MODEL_MB = 10_000_000.0
MAX_RUN_MS = float(DAY_S * 1000)
MAX_TRANSFER_KB = 1e9
MAX_UPCOMING = 32  # models a serving task names as planned next on its GPU (look-ahead)

MAX_NODE_GPUS = 64
MAX_GPU_TYPES = 256  # priced in the policy file: placement records its knobs whole
MAX_GPU_INDEX = 1023

MAX_BUDGET_NODES = 10_000
MAX_BUDGET_WEIGHT = 1e9
MAX_BUDGET_USERS = 10_000  # members or managers of one node
MAX_TREE_BYTES = 512 * KIB  # an encoded budget tree: every BudgetChanged carries it whole

MAX_REASON_CHARS = 1000  # a reason placement writes; longer ones are cut
MAX_SERVING_RESERVE = 100.0  # spare serving GPUs per √ of its load: more is a typo
# How far back the serving pool averages its busy GPUs: its state keeps a mark a second.
MAX_SERVING_LOAD_WINDOW_S = 3600.0
MAX_SERVING_RESERVE_MIN = 100_000  # idle serving GPUs kept warm: beyond any cluster
# How far back compass counts serving's load: its state keeps every arrival that long.
MAX_ADMIT_WINDOW_S = 3600.0
