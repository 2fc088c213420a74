"""Public names read ``aiodlock.X`` (tracebacks, reprs), and still pickle."""

from __future__ import annotations

import inspect
import pickle
import subprocess
import sys
import traceback
from pathlib import Path

import pytest

import aiodlock

EXCEPTIONS = [
    aiodlock.LockError,
    aiodlock.ConfigurationError,
    aiodlock.Unsupported,
    aiodlock.LockTimeout,
    aiodlock.LockNotOwned,
    aiodlock.LockLost,
    aiodlock.BackendError,
    aiodlock.BackendTimeout,
]


def test_every_public_class_and_function_names_the_public_module() -> None:
    public = [getattr(aiodlock, name) for name in aiodlock.__all__ if name != "__version__"]
    named = [obj for obj in public if isinstance(obj, type) or inspect.isfunction(obj)]
    assert {obj.__qualname__ for obj in named} >= {"Client", "Lease", "Lock", "LockStatus"}
    assert {exc.__qualname__ for exc in EXCEPTIONS} <= {obj.__qualname__ for obj in named}
    for obj in named:
        assert obj.__module__ == "aiodlock", obj
    assert repr(aiodlock.ConfigurationError) == "<class 'aiodlock.ConfigurationError'>"


def test_a_traceback_names_aiodlock_configuration_error() -> None:
    with pytest.raises(aiodlock.ConfigurationError) as caught:
        aiodlock.connect("nosuchscheme://host")
    text = "".join(traceback.format_exception(caught.value))
    assert "aiodlock.ConfigurationError: " in text
    assert "aiodlock._errors" not in text


def test_an_uncaught_error_prints_the_public_name() -> None:
    code = "import aiodlock; aiodlock.connect('nosuchscheme://host')"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 1
    assert result.stderr.splitlines()[-1].startswith("aiodlock.ConfigurationError: ")


@pytest.mark.parametrize("exc_type", EXCEPTIONS)
def test_exceptions_pickle_to_the_same_class(exc_type: type[aiodlock.LockError]) -> None:
    error = exc_type("lock 'a' failed")
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is exc_type
    assert copy.args == ("lock 'a' failed",)


def test_a_transient_backend_error_keeps_its_flag_through_pickle() -> None:
    error = aiodlock.BackendError("redis: call failed")
    error.transient = True
    assert pickle.loads(pickle.dumps(error)).transient is True


def test_lock_status_pickles_and_reads_aiodlock_in_its_repr() -> None:
    status = aiodlock.LockStatus(name="a", owner="c/1", token=3, expires_in=None, waiters=2)
    assert pickle.loads(pickle.dumps(status)) == status
    assert repr(status).startswith("LockStatus(")
    assert pickle.dumps(status).count(b"aiodlock._types") == 0


def test_the_api_reference_documents_every_public_name() -> None:
    page = Path(__file__).resolve().parents[2] / "docs" / "reference.md"
    documented = {
        line.removeprefix("::: aiodlock.").strip()
        for line in page.read_text().splitlines()
        if line.startswith("::: aiodlock.")
    }
    assert documented == set(aiodlock.__all__) - {"__version__"}
