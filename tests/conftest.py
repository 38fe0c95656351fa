"""Shared pytest fixtures (plain helpers live in the importable package ``tests.helpers``)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def one_torch_thread():
    """torch on one thread for the module: the fixtures' matmuls are tiny, so one thread is
    fastest and does not oversubscribe shared CI cores. Use with
    ``pytestmark = pytest.mark.usefixtures("one_torch_thread")``."""
    import torch

    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(prev)
