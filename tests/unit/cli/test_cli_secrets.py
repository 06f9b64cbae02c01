"""`qm secret set USER NAME`: the value from stdin into a store only its owner reads."""

from __future__ import annotations

import stat
from pathlib import Path

from typer.testing import CliRunner

from cli.app import app


def test_a_secret_is_stored_readable_by_its_owner_only(tmp_path: Path) -> None:
    store = tmp_path / "store"
    result = CliRunner().invoke(
        app, ["secret", "set", "alice", "API_KEY"], input="v4lue\n",
        env={"QM_SECRETS_DIR": str(store)},
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    path = store / "alice" / "API_KEY"
    assert path.read_text() == "v4lue"
    modes = [stat.S_IMODE(p.stat().st_mode) for p in (store, store / "alice", path)]
    assert modes == [0o700, 0o700, 0o600]


def test_names_that_could_leave_the_store_are_refused(tmp_path: Path) -> None:
    env = {"QM_SECRETS_DIR": str(tmp_path / "store"), "COLUMNS": "200"}
    for args, says in (
        (["../bob", "K"], "cannot name a folder of the store"),
        (["bob", "../K"], "a name of letters, digits and _"),
    ):
        result = CliRunner().invoke(app, ["secret", "set", *args], input="x", env=env)
        assert result.exit_code == 2 and says in result.output
    assert not (tmp_path / "store").exists()
