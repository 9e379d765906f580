"""Shared fixtures: model directories made by the project itself (nothing from a hub)."""

from __future__ import annotations

from pathlib import Path

import pytest

from workers.model.prepare import make_tiny_model, prepare_default_model


@pytest.fixture(scope="session")
def default_model_dir() -> Path:
    """SmolLM2-135M-Instruct converted from the shipped GGUF (cached across runs)."""
    return prepare_default_model()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory, default_model_dir: Path) -> Path:
    """A 4-layer random Llama with GQA and SmolLM2's tokenizer."""
    return make_tiny_model(
        tmp_path_factory.mktemp("models") / "tiny-llama", seed=0, tokenizer_dir=default_model_dir
    )
