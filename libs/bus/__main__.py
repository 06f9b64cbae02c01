"""``python -m libs.bus``: create Quartermaster's topics (idempotent)."""

import asyncio

from libs.bus.settings import KafkaSettings
from libs.bus.topics import ensure_topics, load_topic_config

created = asyncio.run(ensure_topics(KafkaSettings.from_env(), load_topic_config()))
print(f"topics: created {', '.join(created)}" if created else "topics: all present")
