"""The trust settings of a service, from its environment (a ``ConfigError`` says what
is missing or wrong).

``QM_TRUST_FILE``: the trust file a reader of the log checks records with (placement,
``qm audit verify``). ``QM_EVENTS_KEY_FILE``: a writer's own private key (PEM), whose
public half the trust file lists under the writer's role.
"""

from __future__ import annotations

import os
from pathlib import Path

from libs.bus.writers import Role
from libs.config.document import ConfigError
from libs.trust import Gate, SigningKey, load_trust


def gate_from_env(environ: dict[str, str] | None = None) -> Gate:
    env = os.environ if environ is None else environ
    path = env.get("QM_TRUST_FILE")
    if not path:
        raise ConfigError(
            "environment: QM_TRUST_FILE is not set: give the trust file that lists the "
            "services' public keys (`python -m libs.trust init DIR` makes one)"
        )
    return Gate(load_trust(Path(path)))


def signing_key_from_env(role: Role, environ: dict[str, str] | None = None) -> SigningKey:
    env = os.environ if environ is None else environ
    path = env.get("QM_EVENTS_KEY_FILE")
    if not path:
        raise ConfigError(
            f"environment: QM_EVENTS_KEY_FILE is not set: give {role}'s private key, "
            "whose public half the trust file lists (`python -m libs.trust init DIR`)"
        )
    return SigningKey.of_service(role, Path(path))
