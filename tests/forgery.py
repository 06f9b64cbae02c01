"""Tokens made as an attacker would make them: from whatever key material is at hand,
taken as an HMAC secret and, where it holds one, as a private key."""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import hmac
import json
import re
import time
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import jwt
import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from libs.auth.tokens import key_id

_ANY_PEM = re.compile(rb"-----BEGIN ([A-Z ]+)-----.*?-----END \1-----", re.S)
_PEM = re.compile(rb"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?-----END [A-Z ]*PRIVATE KEY-----", re.S)
_HMAC = {"HS256": hashlib.sha256, "HS384": hashlib.sha384, "HS512": hashlib.sha512}
_CURVES = {"secp256r1": "ES256", "secp384r1": "ES384", "secp521r1": "ES512", "secp256k1": "ES256K"}
_MAX_LINES = 400


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def claims(
    user: str, issuer: str = "quartermaster", audience: str = "quartermaster"
) -> dict[str, Any]:
    now = int(time.time())
    return {"sub": user, "iss": issuer, "aud": audience, "iat": now, "exp": now + 600}


def hmac_token(
    payload: Mapping[str, object], secret: bytes, kid: str | None = None, alg: str = "HS256"
) -> str:
    """An HMAC-signed JWT, made by hand: PyJWT refuses a PEM key as an HMAC secret, an
    attacker need not."""
    header: dict[str, object] = {"alg": alg, "typ": "JWT"}
    if kid is not None:
        header["kid"] = kid
    signed = f"{b64url(json.dumps(header).encode())}.{b64url(json.dumps(payload).encode())}"
    mac = hmac.new(secret, signed.encode(), _HMAC[alg]).digest()
    return f"{signed}.{b64url(mac)}"


def private_keys(material: bytes) -> list[Any]:
    """Every private key ``material`` holds: PEM blocks anywhere in it, DER, 32 raw bytes
    (an Ed25519 seed), or any of those in base64 (whole, or a line of it)."""
    found: list[Any] = []
    for block in _PEM.findall(material):
        with contextlib.suppress(ValueError, TypeError):
            found.append(serialization.load_pem_private_key(block, password=None))
    candidates = [material, material.strip()]
    for text in (material, *material.splitlines()[:_MAX_LINES]):
        with contextlib.suppress(binascii.Error, ValueError):
            candidates.append(base64.b64decode(text.strip(), validate=True))
    for raw in candidates:
        if len(raw) == 32:
            found.append(Ed25519PrivateKey.from_private_bytes(raw))
        with contextlib.suppress(ValueError, TypeError):
            found.append(serialization.load_der_private_key(raw, password=None))
    return found


def secrets(material: bytes) -> set[bytes]:
    """``material`` as an HMAC secret might be taken from it: whole, stripped, each line,
    each text a YAML or JSON document holds, each PEM block in it; and each public key it
    holds in its other forms (DER, raw)."""
    found = {material, material.strip()}
    found |= {line.strip() for line in material.splitlines()[:_MAX_LINES]}
    found |= {text.encode() for text in _texts(material)}
    blocks = [block.group(0) for block in _ANY_PEM.finditer(material)]
    found |= {b for block in blocks for b in (block, block + b"\n")}
    for block in blocks:
        try:
            public = serialization.load_pem_public_key(block)
        except (ValueError, TypeError):
            continue
        der = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        found.add(public.public_bytes(*der))
        if isinstance(public, Ed25519PublicKey):
            raw = serialization.Encoding.Raw, serialization.PublicFormat.Raw
            found.add(public.public_bytes(*raw))
    return {s for s in found if s}


def _texts(material: bytes) -> Iterator[str]:
    """Every string in ``material`` read as YAML (or JSON), and each stripped."""
    try:
        documents = list(yaml.safe_load_all(material))
    except (yaml.YAMLError, UnicodeDecodeError, ValueError):
        return
    stack: list[object] = documents
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            yield from {item, item.strip()}
        elif isinstance(item, Mapping):
            stack += [*item.keys(), *item.values()]
        elif isinstance(item, list):
            stack += item


def forgeries(
    material: bytes, payload: Mapping[str, object], kids: Iterable[str]
) -> Iterator[tuple[str, str]]:
    """(how, token) for each token for ``payload`` one can make from ``material``: HMAC
    with each secret it may be (no kid, and each of ``kids``), and signed with each
    private key it holds (its own kid, and each of ``kids``)."""
    kids = list(kids)
    for secret in secrets(material):
        for alg in _HMAC:
            for kid in (None, *kids):
                yield (
                    f"{alg} with {len(secret)} bytes as the secret",
                    hmac_token(payload, secret, kid, alg),
                )
    for key in private_keys(material):
        if isinstance(key, Ed25519PrivateKey):
            alg, own = "EdDSA", [key_id(key.public_key())]
        elif isinstance(key, rsa.RSAPrivateKey):
            alg, own = "RS256", []
        elif isinstance(key, ec.EllipticCurvePrivateKey) and key.curve.name in _CURVES:
            alg, own = _CURVES[key.curve.name], []
        else:
            continue
        for kid in dict.fromkeys([*own, *kids]):
            yield (
                f"{alg} with a {type(key).__name__}",
                jwt.encode(dict(payload), key, algorithm=alg, headers={"kid": kid}),
            )
