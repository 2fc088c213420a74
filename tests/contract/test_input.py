"""Bad input is refused up front, the same way on every backend, and nothing is locked."""

from __future__ import annotations

import pytest

import aiodlock

YEAR = 365 * 24 * 3600


@pytest.mark.parametrize("ttl", [1e13, YEAR + 1])
async def test_a_lease_longer_than_a_year_is_refused(client: aiodlock.Client, ttl: float) -> None:
    with pytest.raises(aiodlock.ConfigurationError, match="ttl must be at most one year"):
        client.lock("long", ttl=ttl)
    with pytest.raises(aiodlock.ConfigurationError, match="timeout must be at most one year"):
        await client.lock("long").acquire(timeout=ttl)
    assert await client.status("long") is None
    async with client.lock("long", ttl=YEAR, timeout=YEAR) as lease:  # the limit itself is fine
        assert lease.token > 0
        with pytest.raises(aiodlock.ConfigurationError, match="ttl must be at most one year"):
            await client.lock("long").extend(ttl=ttl)


@pytest.mark.parametrize("option", ["watchdog_ttl", "op_timeout", "connect_timeout"])
def test_an_option_longer_than_a_year_is_refused(lock_url: str, option: str) -> None:
    with pytest.raises(aiodlock.ConfigurationError, match=f"{option}.*at most one year"):
        aiodlock.connect(lock_url, **{option: 1e13})


@pytest.mark.parametrize(
    ("template", "fragment"),
    [
        ("job:{x:{width}}", "'width', which is not a parameter"),
        ("job:{x!z}", "unknown conversion '!z'"),
        ("job:{x:>{missing}}", "'missing', which is not a parameter"),
    ],
)
def test_a_template_is_checked_whole_when_decorating(
    client: aiodlock.Client, template: str, fragment: str
) -> None:
    with pytest.raises(aiodlock.ConfigurationError, match=fragment):

        @client.locked(template)
        async def job(x: int) -> None: ...


async def test_a_template_with_a_nested_spec_that_names_a_parameter_works(
    client: aiodlock.Client,
) -> None:
    seen: list[str] = []

    @client.locked("job:{x:>{width}}")
    async def job(x: int, width: int) -> None:
        lease = client.lock(f"job:{x:>{width}}").lease
        assert lease is not None
        seen.append(lease.name)

    await job(7, 3)
    assert seen == ["job:  7"]
