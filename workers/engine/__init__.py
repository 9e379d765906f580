"""One model engine in-process: the engine itself, its thread, its parts, the model runner, a
step's execution, offline use, warm-up."""
