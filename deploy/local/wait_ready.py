"""Wait until the local stack's services answer: gRPC health checks and HTTP.

Usage: python deploy/local/wait_ready.py [--timeout S] grpc:HOST:PORT http://URL ...
A gRPC service is asked over TLS when ``QM_TLS_CA`` is set (``services.tls``).
"""

from __future__ import annotations

import argparse
import sys
import time
import urllib.request

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.tls import TlsSettings, channel


def answers(target: str) -> bool:
    if target.startswith("grpc:"):
        with channel(target.removeprefix("grpc:"), TlsSettings.from_env()) as health:
            stub = health_pb2_grpc.HealthStub(health)
            try:
                reply = stub.Check(health_pb2.HealthCheckRequest(), timeout=1)
            except grpc.RpcError:
                return False
            return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)
    try:
        with urllib.request.urlopen(target, timeout=1) as reply:
            return bool(200 <= reply.status < 300)
    except OSError:  # refused, or an HTTP error such as 503 "still recovering"
        return False


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--timeout", type=float, default=60)
    parser.add_argument("targets", nargs="+")
    args = parser.parse_args()
    deadline = time.monotonic() + args.timeout
    waiting = list(args.targets)
    while waiting and time.monotonic() < deadline:
        waiting = [t for t in waiting if not answers(t)]
        if waiting:
            time.sleep(0.3)
    if waiting:
        print(f"not ready after {args.timeout:g} s: {', '.join(waiting)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
