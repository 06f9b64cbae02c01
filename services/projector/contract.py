"""The projector's HTTP contract, shared by its views and its client."""

PROTOBUF = "application/x-protobuf"
READY = "/ready"
USAGE = "/usage"
CONFIG = "/config"
