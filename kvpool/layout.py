"""The KV layout on the wire: which bytes of a worker's cache are one pool object.

A worker's paged KV cache is one slab shaped ``[num_layers, num_blocks, 2, block_tokens,
kv_heads, head_dim]`` (DESIGN.md), so the (layer, block) span is contiguous and is exactly
one pool object. This module is pure arithmetic over that shape; it imports no torch.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

ELEMENT_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
_WIRE = re.compile(r"L(\d{1,6})xbt(\d{1,6})xH(\d{1,6})xD(\d{1,6})x(\w+)")


@dataclass(frozen=True)
class KVLayout:
    """Shape of one worker's KV slab. Two workers exchange blocks only if ``wire`` matches."""

    num_layers: int
    num_blocks: int
    block_tokens: int
    kv_heads: int
    head_dim: int
    dtype: str

    def __post_init__(self) -> None:
        if self.dtype not in ELEMENT_BYTES:
            raise ValueError(f"unsupported KV dtype {self.dtype!r}")
        for name in ("num_layers", "num_blocks", "block_tokens", "kv_heads", "head_dim"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive")

    @property
    def span_bytes(self) -> int:
        """Bytes of one (layer, block) object: K and V for ``block_tokens`` tokens."""
        return 2 * self.block_tokens * self.kv_heads * self.head_dim * ELEMENT_BYTES[self.dtype]

    @property
    def slab_bytes(self) -> int:
        return self.num_layers * self.num_blocks * self.span_bytes

    @property
    def wire(self) -> str:
        """What a reader must agree on to interpret an object's bytes (not the page count)."""
        return (
            f"L{self.num_layers}xbt{self.block_tokens}xH{self.kv_heads}xD{self.head_dim}"
            f"x{self.dtype}"
        )

    @classmethod
    def from_wire(cls, wire: str, num_blocks: int = 1) -> KVLayout:
        """The layout named ``wire`` (:attr:`wire`) with ``num_blocks`` pages; ValueError
        for a name that is not one."""
        match = _WIRE.fullmatch(wire)
        if match is None:
            raise ValueError(f"not a KV layout name: {wire[:80]!r}")
        layers, tokens, heads, dim = (int(g) for g in match.groups()[:4])
        return cls(layers, num_blocks, tokens, heads, dim, match.group(5))

    def offset(self, layer: int, block: int) -> int:
        """Byte offset of the (layer, block) span from the start of the slab."""
        assert 0 <= layer < self.num_layers and 0 <= block < self.num_blocks
        return (layer * self.num_blocks + block) * self.span_bytes


def token_bytes(wire: str) -> int:
    """Bytes of one token's KV over all layers in the layout named ``wire``
    (:attr:`KVLayout.wire`); ``ValueError`` for a name that is not one."""
    layout = KVLayout.from_wire(wire)
    return layout.num_layers * 2 * layout.kv_heads * layout.head_dim * ELEMENT_BYTES[layout.dtype]
