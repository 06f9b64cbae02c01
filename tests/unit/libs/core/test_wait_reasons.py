"""Why a job waits is a code with fields; its words are rendered from them, at the edge."""

from __future__ import annotations

import string
from pathlib import Path

import pytest

from libs.core.wait_reasons import WORDS, WaitCode, WaitReason
from libs.events.logfile import read_log

GOLDEN = Path(__file__).resolve().parents[3] / "golden"


def _named(code: WaitCode) -> set[str]:
    return {name for _, name, _, _ in string.Formatter().parse(WORDS[code]) if name}


def test_every_code_has_its_words() -> None:
    assert set(WORDS) == set(WaitCode)


def test_the_words_quote_the_fields_in_order() -> None:
    why = WaitReason.of(WaitCode.TOO_FEW_GPUS, needs="17×H100", total=16)
    assert why.fields == (("needs", "17×H100"), ("total", "16"))
    assert why.words() == "needs 17×H100; the cluster has only 16 such GPUs"
    # The digest covers the code and the fields, from which the words follow.
    assert why.fact() == "too_few_gpus(('needs', '17×H100'), ('total', '16'))"


@pytest.mark.parametrize("log", sorted(GOLDEN.glob("*.decisions.bin")), ids=lambda p: p.stem)
def test_every_recorded_reason_is_its_codes_words(log: Path) -> None:
    """Each JobPending of the golden logs: its words are its code's, over exactly the
    fields it records (none missing, none the words leave out)."""
    pending = [env.job_pending for env in read_log(log) if env.HasField("job_pending")]
    assert pending
    for record in pending:
        code = WaitCode(record.code)
        fields = tuple((f.name, f.value) for f in record.fields)
        assert {name for name, _ in fields} == _named(code)
        assert WaitReason(code, fields).words() == record.reason
