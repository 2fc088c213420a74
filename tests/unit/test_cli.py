"""The ``aiodlock`` command line, driven as real subprocesses sharing a SQLite lock file."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import aiodlock
from aiodlock import cli
from aiodlock.cli._demo import Record, analyse

REPO = Path(__file__).resolve().parents[2]


# -- helpers ----------------------------------------------------------------------------------


def _env(tmp_path: Path, url: str | None) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("AIODLOCK_URL", None)
    if url is not None:
        env["AIODLOCK_URL"] = url
    env["XDG_CACHE_HOME"] = str(tmp_path / "cache")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    return env


@pytest.fixture
def db_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'locks.db'}"


@pytest.fixture
def env(tmp_path: Path, db_url: str) -> dict[str, str]:
    return _env(tmp_path, db_url)


def run_cli(
    env: dict[str, str], *args: str, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "aiodlock", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def wait_for(predicate: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


class Holder:
    """A background ``aiodlock run NAME -- <script>`` that holds the lock until told to stop.

    The command writes its environment's owner and token to files, then waits for ``stop``.
    """

    def __init__(
        self, env: dict[str, str], tmp_path: Path, name: str, *cli_args: str, trap: str = ""
    ) -> None:
        self.dir = tmp_path / f"holder-{name}"
        self.dir.mkdir()
        script = (
            f"{trap}"
            'echo "$AIODLOCK_OWNER" > owner.tmp && mv owner.tmp owner; '
            'echo "$AIODLOCK_TOKEN" > token; '
            "echo $$ > pid; "
            "while [ ! -f stop ]; do sleep 0.02; done; exit 0"
        )
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "aiodlock", *cli_args, "run", name, "--", "sh", "-c", script],
            env=env,
            cwd=self.dir,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        wait_for(self.started, f"the holder of {name!r} to start")

    def started(self) -> bool:
        if self.proc.poll() is not None:
            _, err = self.proc.communicate()
            raise AssertionError(f"holder exited early ({self.proc.returncode}): {err}")
        return (self.dir / "owner").exists()

    @property
    def owner(self) -> str:
        return (self.dir / "owner").read_text().strip()

    @property
    def token(self) -> int:
        return int((self.dir / "token").read_text())

    @property
    def child_pid(self) -> int:
        return int((self.dir / "pid").read_text())

    def stop(self, timeout: float = 30) -> tuple[int, str]:
        (self.dir / "stop").touch()
        return self.wait(timeout)

    def wait(self, timeout: float = 30) -> tuple[int, str]:
        _, err = self.proc.communicate(timeout=timeout)
        return self.proc.returncode, err

    def kill(self) -> None:
        """Teardown: stop the command, and kill everything that does not stop in time."""
        if self.proc.poll() is None:
            (self.dir / "stop").touch()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if (self.dir / "pid").exists():
            try:
                os.kill(self.child_pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()


@pytest.fixture
def holders() -> Iterator[list[Holder]]:
    started: list[Holder] = []
    yield started
    for holder in started:
        holder.kill()


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0): look at its state.
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


# -- parsing, help, configuration -------------------------------------------------------------


def test_version_and_help(env: dict[str, str]) -> None:
    version = run_cli(env, "--version")
    assert version.returncode == 0
    assert version.stdout.strip() == f"aiodlock {aiodlock.__version__}"
    helped = run_cli(env, "--help")
    assert helped.returncode == 0
    for command in ("run", "status", "release", "demo", "AIODLOCK_URL"):
        assert command in helped.stdout
    assert "_demo-worker" not in helped.stdout
    unknown = run_cli(env, "no-such-command")  # the usage error lists the commands
    assert unknown.returncode == 2
    assert "'demo'" in unknown.stderr
    assert "_demo-worker" not in unknown.stderr
    demo_help = run_cli(env, "demo", "--help").stdout
    assert f"(default: {cli.DEMO_NAMESPACE})" in demo_help
    assert "(default: aiodlock)" not in demo_help
    assert "(default: aiodlock)" in run_cli(env, "status", "--help").stdout
    run_help = run_cli(env, "run", "--help")
    assert "75" in run_help.stdout
    assert "--ttl" in run_help.stdout


def test_usage_errors_exit_2(env: dict[str, str]) -> None:
    no_command = run_cli(env)
    assert no_command.returncode == 2
    bad_timeout = run_cli(env, "run", "x", "--timeout", "-1", "--", "true")
    assert bad_timeout.returncode == 2
    assert "--timeout" in bad_timeout.stderr
    nothing_to_run = run_cli(env, "run", "x")
    assert nothing_to_run.returncode == 2
    assert "no command" in nothing_to_run.stderr


def test_parse_splits_the_command_at_the_first_double_dash() -> None:
    parser = cli.build_parser()
    args = cli.parse_args(parser, ["run", "job", "--ttl", "3", "--", "ls", "--url", "-l", "--"])
    assert args.name == "job"
    assert args.ttl == 3.0
    assert args.command_args == ["ls", "--url", "-l", "--"]
    assert args.url is None
    after = cli.parse_args(parser, ["--url", "memory://a", "status", "s", "--url", "memory://b"])
    assert after.url == "memory://b"
    before = cli.parse_args(parser, ["--url", "memory://a", "status", "run", "--json"])
    assert (before.url, before.name, before.command) == ("memory://a", "run", "status")


def test_configuration_errors_exit_2(tmp_path: Path) -> None:
    env = _env(tmp_path, "nosuchscheme://host/")
    result = run_cli(env, "status", "x")
    assert result.returncode == 2
    assert "unknown URL scheme" in result.stderr
    option = run_cli(_env(tmp_path, None), "--url", "memory://?bogus_option=1", "status", "x")
    assert option.returncode == 2
    assert "bogus_option" in option.stderr


def test_a_duration_over_a_year_exits_2_without_a_traceback(env: dict[str, str]) -> None:
    result = run_cli(env, "run", "--ttl", "1e13", "job", "--", "true")
    assert result.returncode == 2
    assert "ttl must be at most one year" in result.stderr
    assert "Traceback" not in result.stderr


def test_password_never_printed(tmp_path: Path) -> None:
    env = _env(tmp_path, None)
    for url in (
        "redis://user:s3cretpw@127.0.0.1:1/0?connect_timeout=0.5",
        "mysql://user:s3cretpw@127.0.0.1:1/db?connect_timeout=0.5",
    ):
        result = run_cli(env, "--url", url, "status", "x")
        assert result.returncode in (cli.ExitStatus.CONFIG, cli.ExitStatus.UNAVAILABLE), (
            result.stderr
        )
        assert "s3cretpw" not in result.stderr + result.stdout


def test_a_password_given_as_a_query_option_is_never_printed(tmp_path: Path) -> None:
    env = _env(tmp_path, None)
    for url in (
        "zookeeper://127.0.0.1:1/x?username=alice&password=S3CRET&connect_timeout=0.5",
        "redis://127.0.0.1:1/0?username=alice&password=S3CRET&connect_timeout=0.5",
    ):
        result = run_cli(env, "--url", url, "-v", "status", "x")
        assert result.returncode == cli.ExitStatus.UNAVAILABLE, result.stderr
        assert "password=***" in result.stderr
        assert "S3CRET" not in result.stderr + result.stdout


def test_a_raw_slash_in_a_password_is_refused_without_echoing_it(tmp_path: Path) -> None:
    env = _env(tmp_path, None)
    for url in ("zookeeper://alice:pa/SECRET@h", "redis://alice:pa/SECRET@h:6379/0"):
        result = run_cli(env, "--url", url, "status", "x")
        assert result.returncode == cli.ExitStatus.CONFIG, result.stderr
        assert "percent-encoded" in result.stderr
        for part in ("alice", "pa/", "SECRET", "bad port"):
            assert part not in result.stderr, result.stderr


def test_run_exits_70_when_only_the_release_finds_the_lease_lost(
    env: dict[str, str], tmp_path: Path, holders: list[Holder]
) -> None:
    holder = Holder(env, tmp_path, "gone", "-v")  # watchdog_ttl 30: no renewal for 10 s
    holders.append(holder)
    forced = run_cli(env, "release", "gone", "--force")
    assert forced.returncode == 0, forced.stderr
    status, err = holder.stop()  # the command ends with 0, before any renewal
    assert status == cli.ExitStatus.LOST, err
    assert "lost lock 'gone'" in err
    assert "its status: 0" in err
    assert "released lock" not in err


def test_unusable_sqlite_file_exits_69(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    result = run_cli(_env(tmp_path, f"sqlite:///{blocker}/locks.db"), "status", "x")
    assert result.returncode == cli.ExitStatus.UNAVAILABLE, result.stderr
    assert "aiodlock:" in result.stderr


# -- run -----------------------------------------------------------------------------------


def test_run_passes_the_exit_status_and_lock_env(env: dict[str, str], tmp_path: Path) -> None:
    out = tmp_path / "seen"
    result = run_cli(
        env,
        "run",
        "job",
        "--",
        "sh",
        "-c",
        f'echo "$AIODLOCK_NAME $AIODLOCK_TOKEN" > {out}; exit 7',
    )
    assert result.returncode == 7, result.stderr
    name, token = out.read_text().split()
    assert name == "job"
    second = run_cli(env, "run", "job", "--", "sh", "-c", f'echo "$AIODLOCK_TOKEN" > {out}')
    assert second.returncode == 0, second.stderr
    assert int(out.read_text()) > int(token)  # a new acquisition, a larger fencing token
    # The lock was released when the command ended.
    assert run_cli(env, "status", "job").returncode == cli.ExitStatus.FREE


def test_run_command_not_found_exits_127(env: dict[str, str]) -> None:
    result = run_cli(env, "run", "job", "--", "/nonexistent/command")
    assert result.returncode == cli.ExitStatus.COMMAND_NOT_FOUND
    assert "not found" in result.stderr
    assert run_cli(env, "status", "job").returncode == cli.ExitStatus.FREE


def test_run_exits_75_when_the_lock_is_held_elsewhere(
    env: dict[str, str], tmp_path: Path, holders: list[Holder]
) -> None:
    holder = Holder(env, tmp_path, "busy")
    holders.append(holder)
    marker = tmp_path / "ran"
    once = run_cli(env, "run", "busy", "--timeout", "0", "--", "touch", str(marker))
    assert once.returncode == cli.ExitStatus.TEMPFAIL, once.stderr
    assert holder.owner in once.stderr  # the message names the holder
    started = time.monotonic()
    waited = run_cli(env, "run", "busy", "--timeout", "0.5", "--", "touch", str(marker))
    elapsed = time.monotonic() - started
    assert waited.returncode == cli.ExitStatus.TEMPFAIL, waited.stderr
    assert elapsed >= 0.5
    assert not marker.exists()  # the command never ran
    assert holder.stop()[0] == 0
    free = run_cli(env, "run", "busy", "--timeout", "0", "--", "touch", str(marker))
    assert free.returncode == 0, free.stderr
    assert marker.exists()


def test_url_before_or_after_the_command(
    tmp_path: Path, db_url: str, holders: list[Holder]
) -> None:
    env = _env(tmp_path, None)  # no AIODLOCK_URL: the embedded default in XDG_CACHE_HOME
    holders.append(Holder(env, tmp_path, "where", "--url", db_url))
    before = run_cli(env, "--url", db_url, "status", "where")
    after = run_cli(env, "status", "where", "--url", db_url)
    assert before.returncode == after.returncode == 0, before.stderr + after.stderr
    default = run_cli(env, "status", "where")
    assert default.returncode == cli.ExitStatus.FREE, default.stderr  # another database
    assert (tmp_path / "cache" / "aiodlock" / "locks.db").exists()
    # The environment variable is used when there is no --url.
    assert run_cli(_env(tmp_path, db_url), "status", "where").returncode == 0
    # --url after the command wins over --url before it.
    other = f"sqlite:///{tmp_path / 'other.db'}"
    both = run_cli(env, "--url", db_url, "status", "where", "--url", other)
    assert both.returncode == cli.ExitStatus.FREE


def test_status_names_the_holder(
    env: dict[str, str], tmp_path: Path, holders: list[Holder]
) -> None:
    assert run_cli(env, "status", "st").stdout.strip() == "lock 'st' is free"
    holder = Holder(env, tmp_path, "st")
    holders.append(holder)
    shown = run_cli(env, "status", "st")
    assert shown.returncode == 0, shown.stderr
    assert f"holder:     {holder.owner}" in shown.stdout
    assert f"token:      {holder.token}" in shown.stdout
    as_json = run_cli(env, "status", "st", "--json")
    assert as_json.returncode == 0
    data = json.loads(as_json.stdout)
    assert data["held"] is True
    assert data["owner"] == holder.owner
    assert data["token"] == holder.token
    assert 0 < data["expires_in"] <= 30.0
    holder.stop()
    free = run_cli(env, "status", "st", "--json")
    assert free.returncode == cli.ExitStatus.FREE
    assert json.loads(free.stdout) == {"name": "st", "held": False}


def test_release_needs_force_and_breaks_a_held_lock(
    tmp_path: Path, db_url: str, holders: list[Holder]
) -> None:
    env = _env(tmp_path, db_url)
    # A short watchdog so the holder notices the break within a second.
    holder = Holder(env, tmp_path, "rel", "--url", f"{db_url}?watchdog_ttl=3")
    holders.append(holder)
    refused = run_cli(env, "release", "rel")
    assert refused.returncode == 2
    assert "--force" in refused.stderr
    assert run_cli(env, "status", "rel").returncode == 0  # still held
    forced = run_cli(env, "release", "rel", "--force")
    assert forced.returncode == 0, forced.stderr
    assert holder.owner in forced.stdout
    # The holder learns it lost the lock at its next renewal and stops its command.
    status, err = holder.wait(timeout=30)
    assert status == cli.ExitStatus.LOST, err
    assert "lost lock 'rel'" in err
    assert err.count("'rel'") == err.count("lost lock 'rel'"), err  # said once, not twice
    assert not pid_alive(holder.child_pid)
    again = run_cli(env, "release", "rel", "--force")
    assert again.returncode == cli.ExitStatus.FREE
    assert "not held" in again.stdout


def test_fixed_ttl_running_out_stops_the_command(env: dict[str, str], tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    started = time.monotonic()
    result = run_cli(
        env,
        "run",
        "short",
        "--ttl",
        "0.5",
        "--",
        "sh",
        "-c",
        f"echo $$ > {pidfile}; exec sleep 30",
    )
    assert result.returncode == cli.ExitStatus.LOST, result.stderr
    assert time.monotonic() - started < 20  # stopped long before sleep 30 ended
    assert "ran out" in result.stderr
    assert not pid_alive(int(pidfile.read_text()))


@pytest.mark.slow
def test_command_ignoring_sigterm_is_killed_after_the_grace_period(
    env: dict[str, str], tmp_path: Path
) -> None:
    pidfile = tmp_path / "pid"
    result = run_cli(
        env,
        "run",
        "stubborn",
        "--ttl",
        "0.3",
        "--grace",
        "0.3",
        "--",
        "sh",
        "-c",
        f"trap '' TERM; echo $$ > {pidfile}; while :; do sleep 0.05; done",
    )
    assert result.returncode == cli.ExitStatus.LOST, result.stderr
    assert "status: 137" in result.stderr  # SIGKILL
    assert not pid_alive(int(pidfile.read_text()))


def test_sigterm_is_forwarded_to_the_command(
    env: dict[str, str], tmp_path: Path, holders: list[Holder]
) -> None:
    holder = Holder(env, tmp_path, "fwd", trap="trap 'exit 42' TERM; ")
    holders.append(holder)
    holder.proc.send_signal(signal.SIGTERM)
    status, err = holder.wait()
    assert status == 42, err  # the command's own status after the forwarded signal
    assert run_cli(env, "status", "fwd").returncode == cli.ExitStatus.FREE  # released


def test_signal_while_waiting_gives_up_without_running(
    env: dict[str, str], tmp_path: Path, holders: list[Holder]
) -> None:
    holders.append(Holder(env, tmp_path, "wait"))
    marker = tmp_path / "ran"
    waiter = subprocess.Popen(
        [sys.executable, "-m", "aiodlock", "-v", "run", "wait", "--", "touch", str(marker)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert waiter.stderr is not None
        line = waiter.stderr.readline()  # -v says so once the first attempt failed
        assert line.startswith("aiodlock: waiting for lock 'wait'"), line
        waiter.send_signal(signal.SIGINT)
        _, err = waiter.communicate(timeout=30)
    finally:
        if waiter.poll() is None:
            waiter.kill()
    assert waiter.returncode == 128 + signal.SIGINT, err
    assert not marker.exists()


# -- demo ---------------------------------------------------------------------------------


def test_demo_reports_no_overlap_and_increasing_tokens(env: dict[str, str]) -> None:
    result = run_cli(env, "demo", "--workers", "3", "--duration", "1", timeout=90)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = {
        line.split(":", 1)[0]: line.split(":", 1)[1].strip()
        for line in result.stdout.splitlines()
        if ":" in line
    }
    assert lines["overlaps"] == "0"
    assert lines["tokens strictly increasing in entry order"] == "yes"
    total = int(lines["acquisitions"].split()[0])
    per_worker = lines["acquisitions"].split("per worker:")[1].split("(")[0].split()
    assert len(per_worker) == 3
    assert sum(int(w.split("=")[1]) for w in per_worker) == total
    assert total >= 3
    assert lines["result"] == "OK"
    for key in ("wait time", "handoff gap", "total time"):
        assert key in lines
    # SQLite offers fair=True: the demo runs fair, and its report says what that means.
    assert "one fair lock" in result.stdout
    assert "fewest/most" in lines["acquisitions"]
    legend = result.stdout.split("What the numbers mean:")[1]
    assert "request order" in legend
    assert "stands idle between two" in legend


def test_demo_fair_refused_where_the_service_offers_none(env: dict[str, str]) -> None:
    result = run_cli(env, "--url", "redlock://127.0.0.1:1", "demo", "--fair")
    assert result.returncode == 2
    assert "no fair locks" in result.stderr


@pytest.mark.slow
def test_demo_rounds_json(env: dict[str, str]) -> None:
    result = run_cli(
        env, "demo", "--workers", "2", "--rounds", "20", "--no-fair", "--json", timeout=90
    )
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert report["fair"] is False
    assert report["per_worker"] == [20, 20]
    assert report["acquisitions"] == 40
    assert report["overlaps"] == 0
    assert report["tokens_increasing"] is True
    assert report["namespace"] == cli.DEMO_NAMESPACE
    assert report["ok"] is True


def test_demo_refuses_in_process_memory(tmp_path: Path) -> None:
    result = run_cli(_env(tmp_path, "memory://"), "demo", "--workers", "2")
    assert result.returncode == 2
    assert "memory://" in result.stderr


def test_demo_analysis_detects_overlaps_and_token_disorder() -> None:
    record = Record
    clean = [record(0, 1, 0.0, 0.1, 0.2), record(1, 2, 0.0, 0.3, 0.4)]
    report = analyse(clean, collisions=0)
    assert report["overlaps"] == 0
    assert report["tokens_increasing"] is True
    assert report["handoffs"] == 1
    assert report["handoff_p50"] == pytest.approx(0.1)
    overlapping = [record(0, 1, 0.0, 0.1, 0.5), record(1, 2, 0.0, 0.3, 0.4)]
    assert analyse(overlapping, collisions=0)["overlaps"] == 1
    assert analyse(clean, collisions=2)["overlaps"] == 2
    disordered = [record(0, 2, 0.0, 0.1, 0.2), record(1, 1, 0.0, 0.3, 0.4)]
    assert analyse(disordered, collisions=0)["tokens_increasing"] is False
