"""The message bus for envelopes: ports (protocols), Kafka and its settings, topics,
producer, consumer, reader, dead letters. ``libs.bus.memory`` is the bus in memory."""

from libs.bus.consumer import Delivery, EventConsumer
from libs.bus.kafka import KafkaBus
from libs.bus.ports import Bus
from libs.bus.producer import EventProducer
from libs.bus.reader import LogReader, TopicMissing
from libs.bus.settings import KafkaSettings
from libs.bus.topics import Topics, TopicSpec, ensure_topics, load_topic_config

__all__ = [
    "Bus",
    "Delivery",
    "EventConsumer",
    "EventProducer",
    "KafkaBus",
    "KafkaSettings",
    "LogReader",
    "TopicMissing",
    "TopicSpec",
    "Topics",
    "ensure_topics",
    "load_topic_config",
]
