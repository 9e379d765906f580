"""The router's tokenizer slot: loaded once in the background, retried after a failure."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest

from router.flow.tokenizer import TokenizerSlot


def test_preload_then_get_returns_the_one_loaded_tokenizer(default_model_dir: Path) -> None:
    async def main() -> None:
        slot = TokenizerSlot()
        assert not slot.loading
        slot.preload(default_model_dir)
        assert slot.loading

        def never() -> Path:
            raise AssertionError("get must await the running load, not start another")

        first, second = await asyncio.gather(slot.get(never), slot.get(never))
        assert first is second
        assert not slot.loading
        assert first.encode("Hello") == first.encode("Hello") != []
        slot.preload(default_model_dir)  # a finished load is kept
        assert not slot.loading and await slot.get(never) is first

    asyncio.run(main())


def test_a_failed_load_raises_to_its_callers_and_the_next_get_retries(
    default_model_dir: Path, tmp_path: Path
) -> None:
    empty = tmp_path / "model"
    empty.mkdir()

    async def main() -> None:
        slot = TokenizerSlot()
        slot.preload(empty)
        with pytest.raises(FileNotFoundError, match=r"no tokenizer\.json"):
            await slot.get(lambda: empty)
        slot.preload(empty)  # polls do not retry a failed load
        assert not slot.loading
        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(default_model_dir / name, empty / name)
        tok = await slot.get(lambda: empty)
        assert tok.encode("Hello") != []

    asyncio.run(main())
