"""``python -m libs.trust init DIR``: make the services' keys and the trust file in DIR."""

from __future__ import annotations

import sys
from pathlib import Path

from libs.config.document import ConfigError
from libs.trust.install import init


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] != "init":
        print("usage: python -m libs.trust init DIR", file=sys.stderr)
        return 2
    try:
        print(init(Path(argv[1])))
    except ConfigError as exc:
        print(f"trust: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
