"""Caller identity: JWT bearer tokens, checked by every gRPC service."""

from libs.auth.tokens import AuthError, Keys, ServiceToken, issue_token, load_keys, verify_token

__all__ = ["AuthError", "Keys", "ServiceToken", "issue_token", "load_keys", "verify_token"]
