"""Fixtures for every test in this folder; shared models, data and references are in helpers.py."""

from __future__ import annotations

import pytest

from singa import autograd


@pytest.fixture(autouse=True)
def _restore_training_flag():
    """Every test leaves `autograd.training` as it found it (tests and the seeds' scripts switch it freely)."""
    prev = autograd.training
    yield
    autograd.training = prev


@pytest.fixture
def training():
    """Autograd records (the autouse fixture above restores the flag afterwards)."""
    autograd.training = True


@pytest.fixture
def evaluating():
    """Autograd does not record."""
    autograd.training = False
