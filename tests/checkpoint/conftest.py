"""Fixtures for the checkpoint tests: xla tensors placed on any device subset."""

from __future__ import annotations

import pytest
from checkpoint_placement import place


@pytest.fixture
def on_devices(devices8):
    return place
