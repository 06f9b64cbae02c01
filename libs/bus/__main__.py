"""``python -m libs.bus``: create Quartermaster's topics and, on a broker that
authenticates, its principals and their ACLs (idempotent; run as the broker's admin).

``QM_KAFKA_USERS_DIR`` is the folder that keeps each principal's password (one file per
principal, readable only by its owner); without it, principals are left alone.
"""

import asyncio
import os
from pathlib import Path

from libs.bus.principals import ensure_principals
from libs.bus.settings import KafkaSettings
from libs.bus.topics import ensure_topics, load_topic_config

settings, topics = KafkaSettings.from_env(), load_topic_config()
created = asyncio.run(ensure_topics(settings, topics))
print(f"topics: created {', '.join(created)}" if created else "topics: all present")
if users_dir := os.environ.get("QM_KAFKA_USERS_DIR"):
    names = ensure_principals(settings, topics, Path(users_dir))
    print(f"principals: {', '.join(names)} (passwords in {users_dir})")
