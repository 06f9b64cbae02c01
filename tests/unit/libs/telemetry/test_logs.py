"""Every service's log lines: for people, or JSON that leads to the trace."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace import TracerProvider

from libs.auth import SigningKey, issue_token
from libs.telemetry.logs import LogFormat, configure_logs


@pytest.fixture(autouse=True)
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:], root.level = handlers, level


def test_json_lines_carry_the_service_level_and_the_trace_they_were_written_in(
    capsys: pytest.CaptureFixture[str],
) -> None:
    configure_logs("placement", "INFO", "json")
    with TracerProvider().get_tracer("t").start_as_current_span("decide") as span:
        logging.getLogger("services.placement").warning("placed %s", "j-1")
    logging.getLogger("aiokafka").info("rebalancing")  # the libraries' chatter stays out
    [line] = capsys.readouterr().err.splitlines()
    record = json.loads(line)
    context = span.get_span_context()
    assert record["event"] == "placed j-1" and record["level"] == "warning"
    assert (record["service"], record["logger"]) == ("placement", "services.placement")
    assert record["trace_id"] == format(context.trace_id, "032x")
    assert record["span_id"] == format(context.span_id, "016x")


def test_text_lines_read_as_one_line_per_record(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logs("budget", "INFO", "text")
    logging.getLogger("services.budget").info("serving on %d", 50052)
    logging.getLogger("services.budget").debug("not shown")
    [line] = capsys.readouterr().err.splitlines()
    assert "serving on 50052" in line and "info" in line and "service=budget" in line


@pytest.mark.parametrize("form", ["text", "json"])
def test_a_token_a_library_logs_is_written_as_token(
    capsys: pytest.CaptureFixture[str], form: LogFormat
) -> None:
    token = issue_token("carol", SigningKey.generate())
    configure_logs("console", "INFO", form)
    logging.getLogger("aiohttp.access").info('"GET /?token=%s HTTP/1.1" 303', token)
    try:
        raise ValueError(f"bad header: Bearer {token}")
    except ValueError:
        logging.getLogger("services.console").exception("failed")
    written = capsys.readouterr().err
    assert "GET /?token=[token] HTTP/1.1" in written and "Bearer [token]" in written
    assert token not in written and "eyJ" not in written
