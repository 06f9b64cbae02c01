"""``python -m libs.auth keygen DIR``: make the installation's token keys in DIR (kept
if there already) and its public keys file (``libs.auth.keygen``; ``qm token keygen``
does the same)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from libs.auth.keygen import described, keygen
from libs.config.document import ConfigError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m libs.auth", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    make = commands.add_parser("keygen", help="make the token keys in DIR (idempotent)")
    make.add_argument("folder", type=Path, metavar="DIR")
    args = parser.parse_args(argv)
    try:
        made = keygen(args.folder)
    except (ConfigError, OSError) as exc:
        print(f"keygen: {exc}", file=sys.stderr)
        return 1
    print("\n".join(described(made)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
