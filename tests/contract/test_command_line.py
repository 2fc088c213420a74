"""Secrets in URLs and the command line's lost lease, on every backend (issue 18, section 4).

A secret (a password, in the user-info or as a query option, or any option that
``aiodlock._url.SECRET_OPTIONS`` names) never shows in a repr, an error, a log line or the
command line's output; a raw ``/``, ``?`` or ``#`` in a password is refused without echoing
any of the user-info; ``aiodlock run`` exits 70 when its lease was lost before the command
ended, even when only the final release finds out.
"""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
import time
from pathlib import Path

import pytest

import aiodlock
from aiodlock._url import parse_url
from tests.helpers import HANG, worker_env

SECRET = "S3CRETzq"


def _with_query(url: str, query: str) -> str:
    return url + ("&" if "?" in url else "?") + query


def _with_userinfo(url: str, userinfo: str) -> str:
    scheme, _, rest = url.partition("://")
    return f"{scheme}://{userinfo}@{rest.rpartition('@')[2]}"


def _cli(url: str, *args: str, cwd: Path | None = None) -> subprocess.Popen[str]:
    env = worker_env()
    env["AIODLOCK_URL"] = url
    command = [sys.executable, "-m", "aiodlock", *args]
    return subprocess.Popen(
        command, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _output(url: str, *args: str) -> tuple[int, str]:
    proc = _cli(url, *args)
    out, err = proc.communicate(timeout=HANG * 2)
    return proc.returncode, out + err


async def _try(url: str, caplog: pytest.LogCaptureFixture) -> str:
    """Everything a user may see of ``url``: the error, or the client's repr, its errors
    on open and use, and the library's log."""
    shown = []
    with caplog.at_level(logging.DEBUG, logger="aiodlock"):
        try:
            client = aiodlock.connect(url, connect_timeout=2.0, op_timeout=2.0)
        except aiodlock.ConfigurationError as exc:
            return str(exc)
        shown.append(repr(client))
        try:
            async with client:
                shown.append(repr(await client.status("x")))
        except aiodlock.LockError as exc:
            shown.append(str(exc))
    return "\n".join([*shown, caplog.text])


@pytest.mark.parametrize(
    "query",
    [
        f"username=alice&password={SECRET}",
        f"sentinel_password={SECRET}",
        f"ssl_keyfile_password={SECRET}",
        f"token={SECRET}",
    ],
)
async def test_a_secret_query_option_is_never_shown(
    backend_url: str, query: str, caplog: pytest.LogCaptureFixture
) -> None:
    url = _with_query(backend_url, query)
    parsed = parse_url(url)
    for text in (repr(parsed), str(parsed), parsed.redacted(), await _try(url, caplog)):
        assert SECRET not in text, text
    status, output = await asyncio.to_thread(_output, url, "-v", "status", "x")
    assert SECRET not in output, output
    assert status in (0, 1, 2, 69), output


@pytest.mark.parametrize("option", ["password", "sentinel_password"])
def test_a_secret_option_of_the_wrong_type_is_not_echoed(backend_url: str, option: str) -> None:
    with pytest.raises(aiodlock.ConfigurationError) as info:
        aiodlock.connect(backend_url, **{option: 73519046})
    assert "73519046" not in str(info.value)


@pytest.mark.parametrize("special", ["/", "?", "#"])
def test_a_raw_special_character_in_the_password_is_refused_unechoed(
    backend_url: str, special: str
) -> None:
    url = _with_userinfo(backend_url, f"alice:Kx9{special}{SECRET}")
    with pytest.raises(aiodlock.ConfigurationError) as info:
        aiodlock.connect(url)
    message = str(info.value)
    assert "percent-encoded" in message
    for part in ("alice", "Kx9", SECRET):
        assert part not in message, message
    if special == "/":  # the command line says the same, and nothing more
        status, output = _output(url, "status", "x")
        assert status == 2, output
        assert "percent-encoded" in output
        for part in ("alice", "Kx9", SECRET):
            assert part not in output, output


async def test_a_percent_encoded_password_is_read_and_never_shown(
    backend_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    url = _with_userinfo(backend_url, f"alice:Kx9%2F{SECRET}")
    assert parse_url(url).password == f"Kx9/{SECRET}"
    assert SECRET not in await _try(url, caplog)


def test_run_exits_70_when_the_lease_was_lost_before_the_command_ended(
    backend: str, backend_url: str, namespace: str, tmp_path: Path
) -> None:
    """The lock is force-released while the command runs, and the command ends before
    the next renewal (at watchdog_ttl/3 = 10 s): the final release finds the lease gone."""
    if backend == "memory":
        pytest.skip("memory:// locks live inside one process")
    script = "touch started; while [ ! -f go ]; do sleep 0.02; done; exit 0"
    run = _cli(
        backend_url, "-v", "--namespace", namespace, "run", "job", "--", "sh", "-c", script,
        cwd=tmp_path,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + HANG
        while not (tmp_path / "started").exists():
            assert run.poll() is None, run.communicate()
            assert time.monotonic() < deadline, "the command did not start"
            time.sleep(0.02)
        status, output = _output(backend_url, "--namespace", namespace, "release", "job", "--force")
        assert status == 0, output
        (tmp_path / "go").touch()
        _, err = run.communicate(timeout=HANG)
    finally:
        if run.poll() is None:
            run.kill()
            run.communicate()
    assert run.returncode == 70, err
    assert "lost lock 'job'" in err
    assert "released lock" not in err
