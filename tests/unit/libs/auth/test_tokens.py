import pytest

from libs.auth import AuthError, issue_token, verify_token


def test_a_token_names_its_user() -> None:
    assert verify_token(issue_token("alice", b"s3cret"), b"s3cret") == "alice"


def test_a_token_from_another_installation_is_refused() -> None:
    with pytest.raises(AuthError, match="does not match"):
        verify_token(issue_token("alice", b"one"), b"two")


@pytest.mark.parametrize("token", ["", "alice", "qm1.x", "qm2.YWxpY2U.00"])
def test_malformed_tokens_are_refused(token: str) -> None:
    with pytest.raises(AuthError, match="malformed"):
        verify_token(token, b"s3cret")


def test_a_forged_user_is_refused() -> None:
    _, _, signature = issue_token("alice", b"s3cret").split(".")
    with pytest.raises(AuthError):
        verify_token(f"qm1.Ym9i.{signature}", b"s3cret")
