"""Caller identity: JWT bearer tokens (Ed25519), checked by every gRPC service."""

from libs.auth.tokens import (
    AuthError,
    Keys,
    PublicKey,
    ServiceToken,
    SigningKey,
    issue_token,
    load_keys,
    load_service_signer,
    load_signer,
    verify_token,
)

__all__ = [
    "AuthError",
    "Keys",
    "PublicKey",
    "ServiceToken",
    "SigningKey",
    "issue_token",
    "load_keys",
    "load_service_signer",
    "load_signer",
    "verify_token",
]
