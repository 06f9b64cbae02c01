"""No qm command prints a traceback for a user's mistake.

Every command and subcommand is found in the typer app, so a new one is covered
without being listed here; each of its flags gets the bad values its type invites
(text for a number, out of range, NaN, infinities, bad durations, missing,
unreadable, malformed files and unknown keys), and each command that calls a
service runs without a token and against an address nothing listens on. Every
run must exit non-zero with a message that names the flag, file, key or address
at fault, and no traceback.
"""

from __future__ import annotations

import enum
import socket
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from cli import connection
from cli.app import app
from cli.params import Duration, Number, key_value
from libs.auth.keygen import keygen

Path_ = tuple[str, ...]


def commands(command: typing.Any = None, path: Path_ = ()) -> Iterator[tuple[Path_, typing.Any]]:
    command = command if command is not None else typer.main.get_command(app)
    subcommands = getattr(command, "commands", None)
    if subcommands:
        for name, sub in subcommands.items():
            yield from commands(sub, (*path, name))
    else:
        yield path, command


COMMANDS = dict(commands())
# Commands that need no service: their flags and files are checked below, and their
# own environment in test_offline_commands_name_what_is_missing.
OFFLINE = {("sim", "run"), ("sim", "workflows"), ("sim", "mixed"), ("token", "issue"), ("login",)}
OFFLINE |= {("secret", "set"), ("token", "keygen")}  # write a local folder
OFFLINE |= {("audit", "verify"), ("export",)}  # read Kafka directly
# Flags naming data rather than a config file: only the path must be in the error.
DATA_FILES = {"--trace-path"}
# What a command that calls a service needs besides its required arguments.
BASELINE = {("submit",): ["--", "true"], ("update",): ["--gpus", "2"]}
# Required options, given with every bad value of another flag.
REQUIRED = {("export",): ("--since", "1h", "--out", "log.qmlog")}


def dead_address() -> str:
    with socket.socket() as probe:  # free a moment ago; nothing listens on it
        probe.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{probe.getsockname()[1]}"


DEAD = dead_address()


@dataclass(frozen=True)
class Case:
    path: Path_
    args: tuple[str, ...]
    names: tuple[str, ...]  # what the message must mention
    env: tuple[tuple[str, str], ...] = ()

    @property
    def id(self) -> str:
        return " ".join((*self.path, *self.args))[:80]


def required_arguments(command: typing.Any) -> list[str]:
    return ["x" for p in command.params if p.param_type_name == "argument" and p.required]


# Bad input files (written in each test's folder, the working directory), each with what
# its error must name besides the path; "missing" is not written, "." is a folder.
FILES = Path("files")
BAD_FILES: dict[str, tuple[str | bytes | None, tuple[str, ...]]] = {
    "bad-yaml.yaml": ("key: [unclosed\n", ("not valid YAML",)),
    "unknown-key.yaml": ("zz_unknown_key: 1\n", ("zz_unknown_key",)),
    "a-list.yaml": ("- 1\n- 2\n", ()),
    "binary.yaml": (b"\xff\xfe\x00garbage", ()),
    "missing.yaml": (None, ()),
    ".": (None, ()),
}
ONE_WORKFLOW = FILES / "one.yaml"


def write_files(root: Path) -> None:
    (root / FILES).mkdir(parents=True)
    for name, (content, _) in BAD_FILES.items():
        if isinstance(content, bytes):
            (root / FILES / name).write_bytes(content)
        elif content is not None:
            (root / FILES / name).write_text(content)
    (root / ONE_WORKFLOW).write_text("tasks: [{id: a, run_ms: 1, in_kb: 1, out_kb: 1}]\n")


def flag_cases() -> Iterator[Case]:
    """Bad values for every flag, from its declared type."""
    a_file = FILES / "a-list.yaml"
    for path, command in COMMANDS.items():
        for param in command.params:
            if param.param_type_name != "option":
                continue
            flag, kind = param.opts[0], param.type_descriptor.annotation
            parser = param.type_descriptor.parameter_info.parser
            info = param.type_descriptor.parameter_info
            values: list[str] = []
            if kind in (int, float) and parser is None:
                assert kind is int, f"qm {' '.join(path)} {flag}: a real-valued flag is a number()"
                assert param.min is not None and param.max is not None, (
                    f"qm {' '.join(path)} {flag}: a number flag declares min and max"
                )
                values = ["abc", f"{param.min - 1}", f"{param.max + 1}", "1.5"]
            elif isinstance(parser, Number):
                values = ["abc", f"{parser.least - 1}", f"{parser.most + 1}", "-inf", "1e400"]
                values += ["0"] if parser.least > 0 else []
                for value in ("nan", "inf"):  # said as such, not as a bound it broke
                    yield Case(path, (*REQUIRED.get(path, ()), flag, value), (flag, "finite"))
            elif isinstance(parser, Duration):
                values = ["soon", "-5m", "nan", "1e400", "99999999d", "5x"]
                values += ["0"] if parser.positive else []
            elif parser is key_value:
                values = ["NO_EQUALS", "=value"]
            elif typing.get_origin(kind) is typing.Literal or (
                isinstance(kind, type) and issubclass(kind, enum.Enum)
            ):
                values = ["no-such-choice"]
            elif kind is Path and info.exists:
                for name, (_, extra) in BAD_FILES.items():
                    named = (str(FILES / name), *(() if flag in DATA_FILES else extra))
                    yield Case(path, (flag, str(FILES / name)), named)
            elif kind is Path:  # an output folder or file: one that cannot be made
                yield Case(path, (*REQUIRED.get(path, ()), flag, str(a_file / "out")), (flag,))
            for value in values:
                yield Case(path, (*REQUIRED.get(path, ()), flag, value), (flag,))


def extra_cases() -> Iterator[Case]:
    """Flags whose values are text with a structure typer cannot see."""
    yield Case(("submit",), ("--workflow", str(ONE_WORKFLOW), "--workflow-name", "b"), ("'b'",))
    yield Case(("sim", "run"), ("--policy", "lottery"), ("--policy", "lottery"))
    yield Case(("sim", "run"), ("--start", "10", "--end", "5"), ("--start/--end",))
    for value in ("0", "x,16", ",", "16,99999999"):
        yield Case(("sim", "workflows"), ("--gpus", value), ("--gpus",))
    yield Case(("sim", "workflows"), ("--modes", "fastest"), ("--modes", "compass"))
    yield Case(("sim", "workflows"), ("--arrivals", "steady"), ("--arrivals", "poisson"))
    for value in ("x", "5-1", "1-", "-3", "1-5000", ","):
        yield Case(("sim", "workflows"), ("--seeds", value), ("--seeds",))
    for value in ("2", "0", "nan", "half"):
        yield Case(("sim", "mixed"), ("--compare", value), ("--compare",))
    yield Case(("sim", "mixed"), ("--burst-start", "2h", "--burst-end", "1h"), ("--burst-end",))
    for value in ("x", "5-1", "1-5000", ","):
        yield Case(("sim", "mixed"), ("--seeds", value), ("--seeds",))


def environment_cases() -> Iterator[Case]:
    """Every command that calls a service, without a token and with nothing listening."""
    for path, command in COMMANDS.items():
        if path in OFFLINE:
            continue
        args = (*required_arguments(command), *BASELINE.get(path, []))
        no_token = (("QM_TOKEN", ""), ("QM_TOKEN_FILE", "no-token"))
        yield Case(path, args, ("no token", "no-token"), no_token)
        unreadable = (("QM_TOKEN", ""), ("QM_TOKEN_FILE", str(FILES)))
        yield Case(path, args, ("cannot read the token file", str(FILES)), unreadable)
        bad = (("QM_ADDR", "nowhere"), ("QM_BUDGET_ADDR", "nowhere"))
        yield Case(path, args, ("QM_", "nowhere"), bad)
        yield Case(path, args, (DEAD, "unavailable after 5 attempts"))


def run(case: Case) -> None:
    env = {
        "QM_ADDR": DEAD,
        "QM_BUDGET_ADDR": DEAD,
        "QM_TOKEN": "qm1.dGVzdA.00",
        "QM_KAFKA_BOOTSTRAP": DEAD,
        "QM_AUTH_SIGNING_KEY_FILE": "",
        "QM_AUTH_PUBLIC_KEYS_FILE": "",
        "QM_TLS_CA": "",
        "QM_POLICY_FILE": "",
        "COLUMNS": "1000",  # typer's error box: one line per message
        **dict(case.env),
    }
    args = [*case.path, *case.args]
    result = CliRunner().invoke(app, args, env=env)
    shown = f"qm {' '.join(args)}\n{result.output}"
    assert result.exit_code != 0, shown
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        f"{shown}\nraised {result.exception!r}"
    )
    assert "Traceback" not in result.output, shown
    for name in case.names:
        assert name in result.output, f"{shown}\nshould name {name!r}"


@pytest.fixture(autouse=True)
def workdir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Each test runs in its own folder with the bad files; retries are quick."""
    monkeypatch.setattr(connection, "RETRY", connection.Retry(5, 0.01, 0.02, 2.0))
    monkeypatch.chdir(tmp_path)  # the bad files are found here
    write_files(tmp_path)


def test_every_command_is_found() -> None:
    assert {("submit",), ("budget", "tree"), ("sim", "mixed"), ("audit", "verify")} <= set(COMMANDS)
    assert not OFFLINE - set(COMMANDS), "OFFLINE names a command qm no longer has"


# Commands whose default --profiles is the public Compass profiles file, checked first.
READS_PROFILES = {("sim", "workflows"), ("sim", "mixed")}


def parametrized(cases: Iterator[Case]) -> typing.Any:
    params = [
        pytest.param(
            case,
            id=case.id,
            marks=[pytest.mark.shared_data] if case.path in READS_PROFILES else [],
        )
        for case in cases
    ]
    return pytest.mark.parametrize("case", params)


@parametrized(flag_cases())
def test_bad_flag_values_are_refused_by_name(case: Case) -> None:
    run(case)


@parametrized(extra_cases())
def test_bad_structured_values_are_refused_by_name(case: Case) -> None:
    run(case)


@parametrized(environment_cases())
def test_service_commands_fail_clearly_without_token_or_service(case: Case) -> None:
    run(case)


def test_offline_commands_name_what_is_missing(tmp_path: Path) -> None:
    run(Case(("token", "issue"), ("alice",), ("QM_AUTH_SIGNING_KEY_FILE", "keygen")))
    keygen(tmp_path / "keys")
    key = (("QM_AUTH_SIGNING_KEY_FILE", str(tmp_path / "keys" / "issuer.key")),)
    run(Case(("token", "issue"), ("a b",), ("invalid user name",), key))
    run(Case(("token", "issue"), ("alice", "--ttl", "0"), ("--ttl", "> 0"), key))
    (tmp_path / "not-a-key").write_text("k" * 32 + "\n")
    (tmp_path / "not-a-key").chmod(0o600)
    not_a_key = (("QM_AUTH_SIGNING_KEY_FILE", str(tmp_path / "not-a-key")),)
    run(Case(("token", "issue"), ("alice",), ("not-a-key", "not an unencrypted PEM"), not_a_key))
    (tmp_path / "keys" / "issuer.key").chmod(0o644)
    run(Case(("token", "issue"), ("alice",), ("issuer.key", "chmod 600"), key))
    run(Case(("token", "keygen"), (str(tmp_path / "not-a-key" / "keys"),), ("not-a-key",)))
    run(Case(("login",), (), ("name a USER",), key))
    run(Case(("login",), ("--token", "junk"), ("not a token",), key))
    run(Case(("audit", "verify"), (), (DEAD,)))
    bad_kafka = (("QM_KAFKA_SECURITY_PROTOCOL", "carrier-pigeon"),)
    run(Case(("audit", "verify"), (), ("QM_KAFKA_SECURITY_PROTOCOL",), bad_kafka))
    bad_topics = (("QM_TOPICS", "none.yaml"),)
    run(Case(("audit", "verify"), (), ("none.yaml", "cannot read"), bad_topics))
    window = ("--since", "2h", "--out", "log.qmlog")
    run(Case(("export",), window, (f"cannot reach Kafka at {DEAD}", "is it running")))
    run(Case(("export",), ("--since", "soon", "--out", "x"), ("'soon'", "2026-12-04T06:00:00Z")))
    run(Case(("export",), (*window, "--until", "3h"), ("--until is not after --since",)))
