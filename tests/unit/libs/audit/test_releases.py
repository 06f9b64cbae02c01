"""Releases and policy versions in the audit: a release is named, not replayed; another
version's decisions are set aside and named by the release that made them."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st
from qm.v1 import events_pb2

from libs.audit import AuditResult, Difference, OtherRelease, Replay, audit_logs, policy_commits
from libs.core import POLICY, POLICY_VERSION, PolicyConfig
from libs.events import event_type
from libs.events.log_step import policy_configured
from tests.golden.record import RELEASE
from tests.unit.libs.audit.test_replay import _copy, _inputs, _provenance, _recorded, _steps

OLD = POLICY_VERSION - 1
OLD_RELEASE = "0.1.0+g4e665a7aaaaa"


def _as(env: events_pb2.Envelope, version: int, release: str) -> events_pb2.Envelope:
    """``env`` as the release ``release`` of policy ``version`` would have recorded it."""
    relabelled = _copy(env)
    provenance = _provenance(relabelled)
    provenance.policy_version, provenance.release = version, release
    return relabelled


def _announced(offset: int, version: int, release: str) -> events_pb2.Envelope:
    step = next(s for s in _steps(0) if s.offset == offset)
    env = policy_configured(PolicyConfig(), step.input, partition=0, offset=offset, release=release)
    env.policy_configured.policy_version = version
    return env


def _upgraded_at(upgrade: int) -> list[events_pb2.Envelope]:
    """The log of a placement upgraded from OLD to this version at input ``upgrade``:
    each release announced its knobs before its first decision, as placement does."""
    old = [_as(d, OLD, OLD_RELEASE) for d in _recorded(_steps(0)) if _offset(d) < upgrade]
    new = [d for d in _recorded(_steps(0)) if _offset(d) >= upgrade]
    return [
        _announced(_offset(old[0]), OLD, OLD_RELEASE),
        *old,
        _announced(upgrade, POLICY_VERSION, RELEASE),
        *new,
    ]


def _offset(env: events_pb2.Envelope) -> int:
    return _provenance(env).input_offset


def test_every_decision_names_the_release_that_made_it() -> None:
    assert {_provenance(d).release for d in _recorded(_steps(0))} == {RELEASE}


def test_another_release_of_this_version_reproduces_and_its_log_is_left_as_it_came() -> None:
    recorded = [_as(d, POLICY_VERSION, "0.1.0+g0123456789ab.dirty") for d in _recorded(_steps(0))]
    result = audit_logs(_inputs(_steps(0), 0), recorded)
    assert result.ok and result.complete
    assert result.checked == result.reproduced == len(recorded)
    assert {_provenance(d).release for d in recorded} == {"0.1.0+g0123456789ab.dirty"}


def test_a_difference_beside_the_release_does_not_name_the_release() -> None:
    recorded = _recorded(_steps(0))
    tampered = _as(recorded[5], POLICY_VERSION, "another")
    _provenance(tampered).state_digest = b"\0" * 32
    recorded[5] = tampered
    found = audit_logs(_inputs(_steps(0), 0), recorded).divergence
    assert found is not None and found.difference is Difference.DIGEST
    assert found.fields == (f"{event_type(tampered)}.provenance.state_digest",)


def test_a_log_of_another_version_is_named_by_its_release_not_diverged() -> None:
    recorded = _recorded(_steps(0))
    old = [_announced(_offset(recorded[0]), OLD, OLD_RELEASE)]
    old += [_as(d, OLD, OLD_RELEASE) for d in recorded]
    result = audit_logs(_inputs(_steps(0), 0), old)
    assert result.ok and not result.complete
    assert result.divergence is None and result.checked == 0 and not result.config
    assert result.others == (
        OtherRelease(
            0, POLICY, OLD, OLD_RELEASE, _offset(recorded[0]), _offset(recorded[-1]), len(recorded)
        ),
    )


def test_a_log_that_names_no_release_nor_its_knobs_is_set_aside_too() -> None:
    """A log from before decisions named their release, and before placement announced
    its knobs: its decisions alone say who decided."""
    recorded = [_as(d, OLD, "") for d in _recorded(_steps(0))]
    result = audit_logs(_inputs(_steps(0), 0), recorded)
    assert result.ok and result.checked == 0
    assert [(o.policy_version, o.release, o.decisions) for o in result.others] == [
        (OLD, "", len(recorded))
    ]


def test_after_an_upgrade_the_new_versions_decisions_are_checked() -> None:
    upgrade = _steps(0)[len(_steps(0)) // 2].offset
    log = _upgraded_at(upgrade)
    new = [d for d in _recorded(_steps(0)) if _offset(d) >= upgrade]
    old = len(_recorded(_steps(0))) - len(new)
    for ordered in (_in_step(log), _decisions_first(log)):
        assert ordered.ok and ordered.checked == ordered.reproduced == len(new) > 0
        assert [(o.release, o.decisions) for o in ordered.others] == [(OLD_RELEASE, old)]


@settings(max_examples=25, deadline=None)
@given(st.integers(min_value=0, max_value=2**32 - 1))
def test_after_an_upgrade_any_interleaving_of_the_two_logs_gives_the_same_verdict(
    seed: int,
) -> None:
    """The log names who decided an input only as it is read: the replay must not set
    aside (or compare) its own decisions before it has read that far."""
    upgrade = _steps(0)[len(_steps(0)) // 2].offset
    rng = random.Random(seed)
    inputs = list(reversed(_inputs(_steps(0), 0)))
    recorded = list(reversed(_upgraded_at(upgrade)))
    audit = Replay()
    while inputs or recorded:
        if inputs and (not recorded or rng.random() < 0.5):
            audit.feed_input(*inputs.pop())
        else:
            audit.feed_recorded(recorded.pop())
    result = audit.finish()
    new = [d for d in _recorded(_steps(0)) if _offset(d) >= upgrade]
    assert result.ok and result.checked == result.reproduced == len(new)
    assert [o.decisions for o in result.others] == [len(_recorded(_steps(0))) - len(new)]


def test_after_an_upgrade_a_tampered_decision_of_the_new_version_is_caught() -> None:
    upgrade = _steps(0)[len(_steps(0)) // 2].offset
    log = _upgraded_at(upgrade)
    last = log[-1]
    tampered = _copy(last)
    _provenance(tampered).state_digest = b"\0" * 32
    log[-1] = tampered
    found = audit_logs(_inputs(_steps(0), 0), log).divergence
    assert found is not None and found.difference is Difference.DIGEST
    assert found.input_offset == _offset(last)


def _in_step(log: list[events_pb2.Envelope]) -> AuditResult:
    return audit_logs(_inputs(_steps(0), 0), log)


def _decisions_first(log: list[events_pb2.Envelope]) -> AuditResult:
    audit = Replay()
    for env in log:
        audit.feed_recorded(env)
    for item in _inputs(_steps(0), 0):
        audit.feed_input(*item)
    return audit.finish()


def test_the_changelog_names_the_commits_of_every_version_that_ended() -> None:
    for version in range(9, POLICY_VERSION):
        commits = policy_commits(version)
        assert commits is not None, (
            f"docs/policy-versions.md names no commits for v{version}: a version that ends "
            "gains '(commits FIRST to LAST)' on its line"
        )
    assert policy_commits(33) == ("4e665a7", "87063b0")
    assert policy_commits(POLICY_VERSION) is None  # its decisions name their release
