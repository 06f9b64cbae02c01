"""The release a build names: given to an image, else read from the checkout."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from libs.events import release


@pytest.fixture(autouse=True)
def fresh() -> Iterator[None]:
    release.current.cache_clear()
    yield
    release.current.cache_clear()


def test_an_image_names_the_release_its_build_was_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(release.RELEASE_ENV, "0.1.0+g0123456789ab")
    assert release.current() == "0.1.0+g0123456789ab"


def test_a_checkout_names_its_version_and_commit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(release.RELEASE_ENV, raising=False)
    if not (release._SOURCE / ".git").exists():
        pytest.skip("not run from a git checkout")
    assert re.fullmatch(r"\d+\.\d+\.\d+\+g[0-9a-f]{12}(\.dirty)?", release.current())


def test_without_either_the_version_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(release.RELEASE_ENV, raising=False)
    monkeypatch.setattr(release, "_checkout_commit", lambda: None)
    assert re.fullmatch(r"\d+\.\d+\.\d+", release.current())


@pytest.mark.parametrize("named", ["0.1.0 +g1", "x" * 129, "0.1.0+g1;x", "rm -rf /"])
def test_a_release_that_is_not_a_version_string_is_refused_with_the_rule(
    monkeypatch: pytest.MonkeyPatch, named: str
) -> None:
    monkeypatch.setenv(release.RELEASE_ENV, named)
    with pytest.raises(ValueError, match=re.escape("letters, digits and .+_-")):
        release.current()
