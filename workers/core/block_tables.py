"""Block tables kept as one persistent tensor, updated on append rather than rebuilt.

Each running request owns a row of an int32 host tensor ``[rows, max_blocks]``; a step's
block tables are one ``index_select`` of the rows of its sequences. :meth:`BlockTables.row`
copies only the pages a sequence gained since its last step; a sequence whose pages were
given back (preempted, so its table was cleared: :attr:`Sequence.page_epoch` moved on) or a
new sequence under a known id is written anew. Rows are freed by :meth:`BlockTables.release`
(the engine calls it when the request ends) and the tensor grows when every row is taken.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from workers.core.sequence import Sequence


@dataclass
class _Row:
    seq: Sequence
    index: int
    written: int
    epoch: int


class BlockTables:
    """Rows of page ids for up to ``rows`` requests (grows as needed), ``max_blocks`` wide."""

    def __init__(self, max_blocks: int, rows: int = 64) -> None:
        self.table = torch.zeros(rows, max_blocks, dtype=torch.int32)
        self._rows: dict[str, _Row] = {}
        self._free = list(range(rows - 1, -1, -1))

    def __len__(self) -> int:
        return len(self._rows)

    def row(self, seq: Sequence) -> int:
        """The row of ``seq``, brought up to date with its ``block_table``."""
        entry = self._rows.get(seq.request_id)
        if entry is None or entry.seq is not seq or entry.epoch != seq.page_epoch:
            index = entry.index if entry is not None else self._take()
            entry = _Row(seq, index, 0, seq.page_epoch)
            self._rows[seq.request_id] = entry
        pages = seq.block_table
        if len(pages) > entry.written:
            new = pages[entry.written :]
            self.table[entry.index, entry.written : len(pages)] = torch.tensor(
                new, dtype=torch.int32
            )
            entry.written = len(pages)
        return entry.index

    def gather(self, rows: list[int], width: int) -> torch.Tensor:
        """int32 ``[len(rows), width]``: those rows' first ``width`` pages (a copy)."""
        return self.table[torch.tensor(rows, dtype=torch.long), :width]

    def release(self, request_id: str) -> None:
        """Free the row of ``request_id`` (no-op if it has none)."""
        entry = self._rows.pop(request_id, None)
        if entry is not None:
            self._free.append(entry.index)

    def _take(self) -> int:
        if not self._free:
            old = self.table.shape[0]
            grown = torch.zeros(2 * old, self.table.shape[1], dtype=torch.int32)
            grown[:old] = self.table
            self.table = grown
            self._free = list(range(2 * old - 1, old - 1, -1))
        return self._free.pop()
