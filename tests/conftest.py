"""Models shared by the exactness suites: float32, so the engine's tokens can be compared with
generate_step's under the near-tie rule (a file may still define its own fixture)."""

import pytest

from mlxlab import load_model


@pytest.fixture(scope="session")
def tiny():
    return load_model("tiny", dtype="float32")


@pytest.fixture(scope="session")
def small():
    return load_model("small", dtype="float32")
