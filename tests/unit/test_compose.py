"""compose.yaml (servers for a laptop) matches the URLs the docs tell users to run.

Docker is not on the project's machines, so this reads the file: every lock-service URL in
the README and the docs whose hosts are all this machine (127.0.0.1, localhost) must reach
a compose service of the right kind on a port it publishes, with the user and database the
service creates.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]

#: URL scheme -> (kind of compose service, default port).
SCHEMES = {
    "redis": ("redis", 6379),
    "redlock": ("redis", 6379),
    "zookeeper": ("zookeeper", 2181),
    "zk": ("zookeeper", 2181),
    "etcd": ("etcd", 2379),
    "mysql": ("mariadb", 3306),
    "mariadb": ("mariadb", 3306),
    "postgresql": ("postgres", 5432),
    "postgres": ("postgres", 5432),
}
LOOPBACK = {"127.0.0.1", "localhost"}
URL = re.compile(r"\b(" + "|".join(SCHEMES) + r")://([^\s`\"'<>()]+)")
#: benchmarks.md shows the harness's own servers (free ports), not the laptop's.
NOT_CHECKED = {"benchmarks.md"}


def pages() -> list[Path]:
    docs = sorted(p for p in (REPO / "docs").rglob("*.md") if p.name not in NOT_CHECKED)
    return [REPO / "README.md", *docs]


def local_urls(text: str) -> Iterator[tuple[str, str]]:
    """``(scheme, url)`` of every URL whose hosts are all this machine."""
    for match in URL.finditer(text):
        scheme, rest = match.groups()
        hosts = [host for host, _ in endpoints(scheme, rest)]
        if hosts and all(host in LOOPBACK for host in hosts):
            yield scheme, match.group(0).rstrip(".,:;")


def endpoints(scheme: str, rest: str) -> list[tuple[str, int]]:
    netloc = re.split(r"[/?#]", rest, maxsplit=1)[0].rpartition("@")[2]
    found = []
    for part in filter(None, netloc.split(",")):
        host, _, port = part.rpartition(":") if ":" in part else (part, "", "")
        if not port.isdigit():
            if port:  # a placeholder (PORT): not a URL to run
                return []
            port = str(SCHEMES[scheme][1])
        found.append((host, int(port)))
    return found


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    loaded = yaml.safe_load((REPO / "compose.yaml").read_text())
    assert isinstance(loaded, dict)
    return loaded


def kind(service: dict[str, Any]) -> str:
    """The server a service runs: its image's name (``quay.io/coreos/etcd:v3.5`` -> etcd)."""
    return str(service["image"]).rsplit("/", 1)[-1].split(":")[0]


def published(compose: dict[str, Any]) -> dict[int, tuple[str, dict[str, Any]]]:
    """Host port -> (service name, service), for ports published on the loopback."""
    ports: dict[int, tuple[str, dict[str, Any]]] = {}
    for name, service in compose["services"].items():
        for mapping in service.get("ports", []):
            address, host_port, _container = str(mapping).split(":")
            assert address == "127.0.0.1", f"{name} publishes {mapping} beyond this machine"
            assert int(host_port) not in ports, f"port {host_port} published twice"
            ports[int(host_port)] = (name, service)
    return ports


def test_every_service_a_laptop_needs_is_there_with_a_health_check(
    compose: dict[str, Any],
) -> None:
    services = compose["services"]
    kinds = sorted(kind(service) for service in services.values())
    # one Redis and three Redlock masters, ZooKeeper, etcd, MariaDB, PostgreSQL
    assert kinds == sorted(["redis"] * 4 + ["zookeeper", "etcd", "mariadb", "postgres"])
    for name, service in services.items():
        check = service.get("healthcheck", {}).get("test")
        assert check, f"{name} has no health check"
        assert check[0] in ("CMD", "CMD-SHELL"), f"{name}: {check}"
        assert service.get("ports"), f"{name} publishes no port"


def test_every_local_url_in_the_docs_reaches_a_compose_service(compose: dict[str, Any]) -> None:
    ports = published(compose)
    checked: dict[str, set[str]] = {}
    for page in pages():
        for scheme, url in local_urls(page.read_text()):
            where = f"{url} ({page.relative_to(REPO)})"
            want = SCHEMES[scheme][0]
            for _host, port in endpoints(scheme, url.split("://", 1)[1]):
                assert port in ports, f"{where}: compose.yaml publishes no port {port}"
                name, service = ports[port]
                assert kind(service) == want, f"{where}: port {port} is {name}, not {want}"
                checked.setdefault(want, set()).add(name)
                check_credentials(scheme, url, service)
    # The quickstart and the backend pages show a local URL for every service.
    assert set(checked) == {"redis", "zookeeper", "etcd", "mariadb", "postgres"}, checked
    assert len(checked["redis"]) == 4, "the Redlock URL should name the three masters"


def check_credentials(scheme: str, url: str, service: dict[str, Any]) -> None:
    """A database URL names the user and database the service creates (no password)."""
    parts = urlsplit(url)
    env = service.get("environment", {})
    database = parts.path.lstrip("/")
    if SCHEMES[scheme][0] == "mariadb":
        assert parts.username == "root", url
        assert parts.password is None, url
        assert env.get("MARIADB_ALLOW_EMPTY_ROOT_PASSWORD") == "1"
        assert database == env["MARIADB_DATABASE"], url
    elif SCHEMES[scheme][0] == "postgres":
        assert parts.username == env["POSTGRES_USER"], url
        assert parts.password is None, url
        assert env.get("POSTGRES_HOST_AUTH_METHOD") == "trust"
        assert database == env["POSTGRES_DB"], url


def test_the_quickstart_names_only_servers_of_compose() -> None:
    """The quickstart is run on a laptop: every server URL in it is a local one."""
    text = (REPO / "docs" / "quickstart.md").read_text()
    every = [match.group(0) for match in URL.finditer(text)]
    local = [url for _, url in local_urls(text)]
    assert len(every) >= 6
    assert len(local) == len(every), set(every) - set(local)


def test_the_url_reader_sees_what_a_user_would_copy() -> None:
    text = (
        "connect('redlock://127.0.0.1:6380,127.0.0.1:6381,localhost:6382') "
        "`etcd://e1,e2:2380,localhost:2381` zk://127.0.0.1 redis://127.0.0.1:PORT/0 "
        "mysql://root@127.0.0.1:3306/aiodlock?strategy=named."
    )
    found = list(local_urls(text))
    assert found == [
        ("redlock", "redlock://127.0.0.1:6380,127.0.0.1:6381,localhost:6382"),
        ("zk", "zk://127.0.0.1"),
        ("mysql", "mysql://root@127.0.0.1:3306/aiodlock?strategy=named"),
    ]
    assert endpoints("zk", "127.0.0.1") == [("127.0.0.1", 2181)]
