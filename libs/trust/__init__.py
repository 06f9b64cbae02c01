"""Trust inside the log: who signed each record, and whether they may say what it says.

``keys`` makes and reads Ed25519 keys and seals records with them, ``trustfile`` reads
the installation's service keys, and ``gate`` checks a record before anyone folds it.
Which role may write which event is declared beside the bus's ACLs, in
``libs/bus/writers.py``.
"""

from libs.trust.gate import Gate, Rejection
from libs.trust.keys import NodeKeys, SigningKey, node_key_id, seal
from libs.trust.trustfile import TrustFile, load_trust

__all__ = [
    "Gate",
    "NodeKeys",
    "Rejection",
    "SigningKey",
    "TrustFile",
    "load_trust",
    "node_key_id",
    "seal",
]
