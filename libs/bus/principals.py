"""Make the bus's principals real on a broker: a SCRAM user per service, its password in
a file only its owner reads, and the grants of ``libs.bus.access`` as ACLs.

Run as the broker's superuser by ``python -m libs.bus`` (the local stack and the tests);
in Kubernetes the Strimzi operator does the same from
``deploy/k8s/base/kafka/topics-and-users.yaml``.
Idempotent: passwords already in the folder are kept, existing ACLs are left as they are.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from kafka.admin import (
    ACL,
    ACLOperation,
    ACLPermissionType,
    ACLResourcePatternType,
    KafkaAdminClient,
    ResourcePattern,
    ResourceType,
    ScramMechanism,
    UserScramCredentialUpsertion,
)

from libs.bus.access import PRINCIPALS, Grant, grants
from libs.bus.settings import KafkaSettings
from libs.bus.topics import Topics

_RESOURCES = {
    "topic": ResourceType.TOPIC,
    "group": ResourceType.GROUP,
    "transactionalId": ResourceType.TRANSACTIONAL_ID,
}
_PATTERNS = {"literal": ACLResourcePatternType.LITERAL, "prefix": ACLResourcePatternType.PREFIXED}
_OPERATIONS = {
    "Read": ACLOperation.READ,
    "Write": ACLOperation.WRITE,
    "Describe": ACLOperation.DESCRIBE,
    "Create": ACLOperation.CREATE,
    "DescribeConfigs": ACLOperation.DESCRIBE_CONFIGS,
}


class PrincipalsError(Exception):
    """The broker refused a user or an ACL; the message says which and why."""


def password_file(users_dir: Path, name: str) -> Path:
    """Where principal ``name``'s password is kept; made (random) the first time."""
    path = users_dir / name
    if not path.exists():
        users_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        # O_EXCL: two stacks starting at once never overwrite each other's password.
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            return path
        with os.fdopen(fd, "w") as file:
            file.write(secrets.token_hex(24))
    return path


def ensure_principals(settings: KafkaSettings, topics: Topics, users_dir: Path) -> list[str]:
    """Every service's SCRAM user and ACLs on the broker ``settings`` reaches (as admin);
    returns the principals' names."""
    mechanism = ScramMechanism[(settings.sasl_mechanism or "").replace("-", "_")]
    admin = KafkaAdminClient(**settings.client_kwargs(), client_id="qm-principals")
    try:
        users = [
            UserScramCredentialUpsertion(
                p.name, mechanism, password_file(users_dir, p.name).read_text().strip()
            )
            for p in PRINCIPALS
        ]
        refused = {
            user: error
            for user, error in admin.alter_user_scram_credentials(users).items()
            if error
        }
        if refused:
            raise PrincipalsError(f"the broker refused SCRAM users: {refused}")
        result = admin.create_acls([_acl(grant) for grant in grants(topics)])
        if result["failed"]:
            acl, error = result["failed"][0]
            raise PrincipalsError(f"the broker refused ACL {acl}: {error}")
    finally:
        admin.close()
    return [p.name for p in PRINCIPALS]


def _acl(grant: Grant) -> ACL:
    return ACL(
        principal=f"User:{grant.principal}",
        host="*",
        operation=_OPERATIONS[grant.operation],
        permission_type=ACLPermissionType.ALLOW,
        resource_pattern=ResourcePattern(
            _RESOURCES[grant.resource], grant.name, _PATTERNS[grant.pattern]
        ),
    )
