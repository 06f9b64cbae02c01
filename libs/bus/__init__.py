"""Kafka plumbing for envelopes: settings, topics, producer, consumer, dead letters."""

from libs.bus.consumer import Delivery, EventConsumer
from libs.bus.producer import EventProducer
from libs.bus.reader import LogReader
from libs.bus.settings import KafkaSettings
from libs.bus.topics import Topics, ensure_topics, load_topic_config

__all__ = [
    "Delivery",
    "EventConsumer",
    "EventProducer",
    "KafkaSettings",
    "LogReader",
    "Topics",
    "ensure_topics",
    "load_topic_config",
]
