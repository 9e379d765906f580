"""Greedy tokens of plain vLLM, the reference of ``tests/integration/test_vllm_backend.py``:
vLLM's offline ``LLM`` on the model, its engine in this one process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``: about 15 s of CPU, where ``vllm serve`` with its
engine core and worker processes took about 30). A script run with vLLM's Python
(:func:`tests.integration.vllm_cluster.reference_tokens`), never imported by the suite.

``python vllm_reference.py MODEL_DIR OUT_JSON`` reads ``{"prompts": [[ids]], "max_tokens":
n, "block_size": b, "max_model_len": m}`` from stdin and writes each prompt's greedy tokens,
``[[ids]]`` in prompt order, to ``OUT_JSON`` (vLLM logs to stdout).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(model: str, out: str) -> None:
    """Generate and write the tokens (inside vLLM's environment)."""
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    ask = json.load(sys.stdin)
    llm = LLM(
        model=model, dtype="float32", enforce_eager=True, block_size=ask["block_size"],
        max_model_len=ask["max_model_len"],
    )  # fmt: skip
    prompts = [TokensPrompt(prompt_token_ids=p) for p in ask["prompts"]]
    greedy = SamplingParams(max_tokens=ask["max_tokens"], temperature=0.0)
    done = llm.generate(prompts, greedy, use_tqdm=False)
    Path(out).write_text(json.dumps([list(d.outputs[0].token_ids) for d in done]))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
