"""Where a request goes: the placement policies and their types, each worker's live view and
prefix index, admission, the KV wait queue, the pool lookup. Pure where it can be (no I/O
but the pool lookup and the worker view)."""
