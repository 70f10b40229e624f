import os
from pathlib import Path

import jax
import pytest

import slimjax

# compiled programs kept on disk for the session's workers and the processes its tests start (compiling is most of
# a simulation test's time, and the workers compile the same loops): .pytest_cache/jax, or $SLIMJAX_JAX_CACHE
CACHE = Path(os.environ.get("SLIMJAX_JAX_CACHE", Path(__file__).resolve().parent.parent / ".pytest_cache" / "jax"))
for key, value, kind in (
    ("JAX_COMPILATION_CACHE_DIR", str(CACHE), str),
    ("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0", float),
    ("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0", int),
):
    os.environ.setdefault(key, value)  # for the processes tests start
    jax.config.update(key.lower(), kind(os.environ[key]))  # this one imported JAX with slimjax already

# one XLA CPU device per core and float64, before any test runs JAX
slimjax.configure()

REPO = Path(__file__).resolve().parent.parent


def data_dir() -> Path | None:
    path = Path(os.environ.get("SLIMJAX_DATA", REPO.parent / "shared" / "data"))
    return path if path.is_dir() else None


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """../shared/data (or $SLIMJAX_DATA); skipped with a reason when absent, never under CI=true."""
    path = data_dir()
    if path is None:
        if os.environ.get("CI") == "true":
            pytest.fail("shared data not found at ../shared/data or $SLIMJAX_DATA, and CI=true forbids skipping")
        pytest.skip("shared data not found: set SLIMJAX_DATA or place ../shared/data beside the repo")
    return path


# The default run (README's test command, .ci/run) leaves out the slowest recovery and equality cases whose mechanism a
# lighter test also covers, to stay within CI's ten minutes; SLIMJAX_TESTS=all runs every one of them.
HEAVY = "heavy: a slow case the default run leaves out (a lighter test covers its mechanism); SLIMJAX_TESTS=all runs it"


def pytest_configure(config):
    config.addinivalue_line("markers", HEAVY)


# the files that take longest (measured on a clean clone, --durations), run first: the workers take files in this
# order, so the last ones to start are short and neither worker idles long at the end
FIRST = ("test_scale.py", "test_sizing.py", "test_validate.py", "test_fit_serving.py", "test_procure_engine.py")


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(FIRST)))  # stable: each file's own order kept
    if os.environ.get("SLIMJAX_TESTS") == "all":
        return
    heavy = [item for item in items if item.get_closest_marker("heavy")]
    if heavy:
        config.hook.pytest_deselected(items=heavy)
        items[:] = [item for item in items if not item.get_closest_marker("heavy")]


def pytest_report_header(config):
    if os.environ.get("SLIMJAX_TESTS") != "all":
        return "slimjax: the cases marked heavy are left out (SLIMJAX_TESTS=all runs them)"
