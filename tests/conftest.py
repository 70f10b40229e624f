import os
from pathlib import Path

import pytest

import slimjax

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
