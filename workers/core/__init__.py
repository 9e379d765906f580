"""An engine's bookkeeping: sequences, scheduling, pages and their prefix cache, the request
table and book, sampling and logprobs, what an engine hands out. It runs no model and
opens no connection of its own (the step log writes a file; the load snapshot asks the
pool client it is handed)."""
