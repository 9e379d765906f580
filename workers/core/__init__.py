"""An engine's bookkeeping: sequences, scheduling, pages and their prefix cache, the request
table and book, sampling and logprobs, what an engine hands out. No model and no I/O."""
