"""Caller identity: signed bearer tokens, checked by every gRPC service."""

from libs.auth.tokens import AuthError, issue_token, load_secret, verify_token

__all__ = ["AuthError", "issue_token", "load_secret", "verify_token"]
