"""``celery -A proj outbox web``: a real uvicorn process serving the dashboard (stopped by PID)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import httpx
import pytest

from tests.integration.test_cli import cli_app, cli_env, invoke
from tests.procs import ROOT, stop, wait_for
from tests.web.test_browser import free_port

__all__ = ["cli_app", "cli_env"]  # fixtures


def serve(env: dict[str, str], *args: str) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    exe = Path(sys.executable).with_name("celery")
    proc = subprocess.Popen(
        [str(exe), "-A", "tests.cli_app", "outbox", "web", "--port", str(port),
         "--log-level", "warning", *args],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT), **env},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
    )
    return proc, f"http://127.0.0.1:{port}"


def answer(url: str) -> int | None:
    try:
        return httpx.get(url, timeout=2).status_code
    except httpx.TransportError:
        return None


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for proc in procs:
        stop(proc)


def test_web_serves_the_dashboard_and_no_auth_says_so_on_loopback_only(
    cli_app: ModuleType, cli_env: dict[str, str], started: list[subprocess.Popen[bytes]]
) -> None:
    proc, url = serve(cli_env, "--no-auth")
    started.append(proc)
    wait_for(lambda: answer(url + "/api/v1/jobs") == 200 or proc.poll() is not None, 30,
             "the web command to answer")
    jobs = httpx.get(url + "/api/v1/jobs").json()["jobs"]
    assert {j["name"] for j in jobs} == {"cli.greet", "cli.fail", "cli.flaky", "cli.nightly",
                                         "cli.shop.receipt", "cli.billing.receipt"}
    assert "<h1>Jobs</h1>" in httpx.get(url + "/").text
    stop(proc)
    assert proc.stderr is not None
    err = proc.stderr.read().decode()
    assert "NO AUTHENTICATION" in err and "loopback only" in err

    refused = invoke(cli_app, "web", "--no-auth", "--host", "0.0.0.0")
    assert refused.exit_code == 2
    assert "--no-auth serves only a loopback address" in refused.output


def test_web_without_users_answers_401_and_warns(
    cli_app: ModuleType, cli_env: dict[str, str], started: list[subprocess.Popen[bytes]]
) -> None:
    proc, url = serve(cli_env)
    started.append(proc)
    wait_for(lambda: answer(url + "/api/v1/jobs") is not None or proc.poll() is not None, 30,
             "the web command to answer")
    assert answer(url + "/api/v1/jobs") == 401
    assert answer(url + "/") == 401
    stop(proc)
    assert proc.stderr is not None
    assert "no users or tokens configured" in proc.stderr.read().decode()


def test_hash_secret_prints_a_hash_that_verifies(cli_app: ModuleType) -> None:
    from click.testing import CliRunner

    from celery_outbox.cli import outbox as group
    from celery_outbox.web.auth import verify_secret

    result = CliRunner().invoke(group, ["hash-secret"], input="pw-123\npw-123\n",
                                obj=type("O", (), {"app": cli_app.app})())
    assert result.exit_code == 0, result.output
    assert verify_secret("pw-123", result.output.strip().splitlines()[-1])
