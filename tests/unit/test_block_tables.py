"""BlockTables: persistent rows stay equal to every sequence's block table."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from workers.core.block_tables import BlockTables
from workers.core.sequence import SamplingParams, Sequence


def seq(request_id: str, pages: list[int]) -> Sequence:
    s = Sequence(request_id, [1, 2, 3], SamplingParams())
    s.block_table.extend(pages)
    return s


def row_of(tables: BlockTables, s: Sequence) -> list[int]:
    index = tables.row(s)
    return tables.table[index, : len(s.block_table)].tolist()


def test_rows_follow_appends_and_only_copy_new_pages() -> None:
    tables = BlockTables(max_blocks=8, rows=2)
    a = seq("a", [5, 3])
    assert row_of(tables, a) == [5, 3]
    a.block_table.append(9)
    assert row_of(tables, a) == [5, 3, 9]
    tables.table[tables.row(a), 0] = 42  # a row is not rewritten when nothing changed
    assert tables.table[tables.row(a), 0] == 42


def test_a_cleared_table_is_written_anew() -> None:
    tables = BlockTables(max_blocks=8)
    a = seq("a", [1, 2, 3])
    tables.row(a)
    a.block_table.clear()  # preempted: pages given back, then others taken
    a.page_epoch += 1
    a.block_table.extend([7, 8, 9, 10])
    assert row_of(tables, a) == [7, 8, 9, 10]


def test_a_new_sequence_under_a_known_id_is_written_anew() -> None:
    tables = BlockTables(max_blocks=8)
    tables.row(seq("a", [1, 2, 3]))
    b = seq("a", [4, 5, 6])
    assert row_of(tables, b) == [4, 5, 6]
    assert len(tables) == 1


def test_rows_are_reused_after_release_and_the_table_grows() -> None:
    tables = BlockTables(max_blocks=4, rows=2)
    seqs = [seq(str(i), [i, i + 1]) for i in range(5)]
    rows = [tables.row(s) for s in seqs]
    assert sorted(rows) == list(range(5))
    assert tables.table.shape[0] >= 5
    for s in seqs:
        assert row_of(tables, s) == s.block_table
    tables.release("0")
    tables.release("0")  # twice is harmless
    assert tables.row(seq("new", [3])) == rows[0]
    assert tables.gather([rows[2], rows[1]], 2).tolist() == [[2, 3], [1, 2]]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 3), st.sampled_from(["grow", "clear", "end"])), max_size=30)
)
def test_any_sequence_of_changes_keeps_rows_equal(ops: list[tuple[int, str]]) -> None:
    tables = BlockTables(max_blocks=64, rows=1)
    live: dict[int, Sequence] = {}
    page = 0
    for who, op in ops:
        s = live.setdefault(who, seq(f"r{who}", []))
        if op == "grow":
            s.block_table.extend([page, page + 1])
            page += 2
        elif op == "clear":
            s.block_table.clear()
            s.page_epoch += 1
        else:
            tables.release(s.request_id)
            del live[who]
            continue
        for other in live.values():
            assert row_of(tables, other) == other.block_table
