import os
from pathlib import Path

import pytest

import slimjax  # noqa: F401  (sets up float64 and CPU devices before anything imports jax)

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


@pytest.fixture
def small_spec():
    return dict(
        models=["OPT-125m", "Llama-3.1-8B", "DeepSeek-V2", "gemma-2-9b"],
        gpus=["H100-SXM", "A100-SXM-40GB", "L40S"],
        batch=[1, 2, 3, 5, 8, 16, 32, 64, 128],
        input_len=[16, 128, 1000],
        output_len=[1, 7, 256],
        advisor={"epsilon": 0.5, "slo_factor": 4},
        precision="float64",
    )
