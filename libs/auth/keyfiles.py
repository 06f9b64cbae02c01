"""Ed25519 keys in files, for both kinds Quartermaster signs with: tokens
(``libs.auth``) and records of the event log (``libs.trust``). One definition of a
key's fingerprint, and of reading and making a private key file.

A private key is an unencrypted PEM (PKCS#8) file that no account but its owner (and
its group: a Kubernetes Secret mounted 0440 for the pod's ``fsGroup``) may read.
"""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from libs.config.document import ConfigError


def raw_public(key: Ed25519PublicKey) -> bytes:
    """A public key's 32 bytes."""
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def fingerprint(raw: bytes) -> str:
    """A key's name for people and headers: the first 16 bytes of the SHA-256 of its 32
    bytes, in hex."""
    return hashlib.sha256(raw).hexdigest()[:32]


def read_private_key(path: Path, where: str, hint: str) -> Ed25519PrivateKey:
    """The Ed25519 private key in ``path``; a ``ConfigError`` naming ``where`` (the
    setting that gave it) and ``hint`` (how to make one) when it cannot be used."""
    try:
        mode = path.stat().st_mode
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{where} {path}: cannot read: {exc.strerror} ({hint})") from None
    if mode & (stat.S_IROTH | stat.S_IWOTH):
        raise ConfigError(
            f"{where} {path}: every account may read this private key (mode "
            f"{stat.S_IMODE(mode):04o}): chmod 600 it, and make a new one if others had it"
        )
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError):
        raise ConfigError(
            f"{where} {path}: not an unencrypted PEM private key (-----BEGIN PRIVATE "
            f"KEY-----; {hint})"
        ) from None
    if not isinstance(key, Ed25519PrivateKey):
        raise ConfigError(f"{where} {path}: a {type(key).__name__}, not an Ed25519 key")
    return key


def private_pem(key: Ed25519PrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def make_private_key(path: Path, where: str, hint: str) -> Ed25519PrivateKey:
    """The key at ``path``, made there (0600, in a 0700 folder) when there is none. Two
    processes making it at once agree on one (the file is created exclusively)."""
    if not path.exists():
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            return read_private_key(path, where, hint)
        with os.fdopen(fd, "wb") as file:
            os.fchmod(file.fileno(), 0o600)  # whatever the umask
            file.write(private_pem(Ed25519PrivateKey.generate()))
    return read_private_key(path, where, hint)
