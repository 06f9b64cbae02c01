"""Make an installation's service keys and its trust file (``python -m libs.trust``)."""

from __future__ import annotations

import base64
from pathlib import Path

import yaml

from libs.auth.keyfiles import make_private_key, raw_public
from libs.bus.writers import SERVICE_ROLES
from libs.config.document import load
from libs.trust.keys import INIT_HINT
from libs.trust.trustfile import TrustDocument

TRUST_FILE = "trust.yaml"


def init(folder: Path) -> Path:
    """A private key per service role in ``folder`` (``<role>.key``, 0600; kept if there)
    and the trust file listing their public halves (``trust.yaml``: entries already in
    it are kept, so a rotation's old keys stay). Returns the trust file's path."""
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = folder / TRUST_FILE
    entries = (
        [entry.model_dump(exclude_defaults=True) for entry in load(TrustDocument, path).keys]
        if path.exists()
        else []
    )
    listed = {entry["public_key"] for entry in entries}
    for role in SERVICE_ROLES:
        private = make_private_key(folder / f"{role}.key", "key", INIT_HINT)
        public = base64.b64encode(raw_public(private.public_key())).decode()
        if public not in listed:
            entries.append({"role": role, "public_key": public})
    text = "# The services' public keys (libs/trust/trustfile.py).\n"
    path.write_text(text + yaml.safe_dump({"keys": entries}, sort_keys=False))
    return path
