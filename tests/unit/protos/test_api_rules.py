"""The API's own checks, run by `make test`: buf's rules hold for protos/ (and bite on an
undocumented field), and the Go client's committed code is what the protos generate.

Both go through the Makefile (buf-lint, go-client-check), which builds the pinned tools
with Go the first time; without Go they are skipped, saying so.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]

pytestmark = pytest.mark.skipif(
    shutil.which("go") is None,
    reason="Go is not installed: buf and protoc-gen-go are built with it (make buf-lint)",
)


def make(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["make", "-s", *args], cwd=ROOT, capture_output=True, text=True, timeout=900
    )


@pytest.fixture(scope="module", autouse=True)
def api_tools() -> None:
    """Build the pinned tools first: on a machine without Go's module cache, go reports
    each download on stderr, which is not lint output."""
    built = make("api-tools")
    assert built.returncode == 0, built.stderr


def test_buf_lint_finds_nothing() -> None:
    result = make("buf-lint")
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")


def test_buf_lint_refuses_an_undocumented_field(tmp_path: Path) -> None:
    copy = tmp_path / "protos"
    shutil.copytree(ROOT / "protos", copy)
    job_service = copy / "qm" / "v1" / "job_service.proto"
    job_service.write_text(
        job_service.read_text() + "\n// Documented.\nmessage Extra {\n  string bare = 1;\n}\n"
    )
    result = make("buf-lint", f"PROTO_DIR={copy}")
    assert result.returncode != 0
    assert 'Field "bare" should have a non-empty comment' in result.stdout


def test_the_go_clients_code_is_what_the_protos_generate() -> None:
    result = make("go-client-check")
    assert result.returncode == 0, result.stdout + result.stderr
