"""Whether a served greedy answer that differs from the reference is still exactly greedy.

Greedy decoding in fp32 is exact only up to ties: when two tokens' logits are within
rounding of each other (a gap of about 1e-6 was seen on the tiny random model), the
order of floating-point sums (which depends on the batch a request shares) picks one or
the other, and everything after differs. Such an answer is not a wrong token; one made
from wrong KV is. So a mismatch is checked, on its own, against the model:

1. the reference token ids are cut where their text stops being a prefix of the served
   text (position ``k``);
2. at ``k`` the model's two best logits (teacher-forced, transformers) must be within
   :data:`TIE_EPS` and the reference's token one of them, else the answer is wrong;
3. the other token of the tie is taken and greedy continues from there (in-process
   engine); if that text equals the served one the answer is verified, else the check
   repeats at the next divergence, up to :data:`MAX_TIES` times.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvserve.chaos.load import ChaosRequest
from workers.config import EngineConfig
from workers.core.sequence import SamplingParams

TIE_EPS = 1e-4
"""Largest top-2 logit gap treated as a floating-point tie (far below any real error)."""
MAX_TIES = 3


@dataclass(frozen=True)
class Verdict:
    """``exact``: the served text is greedy (up to ``ties`` fp ties); ``gap``: the logit
    gap at the divergence that was not a tie (when not exact)."""

    exact: bool
    ties: int
    gap: float = 0.0


class TieChecker:
    """Loads the engine and the transformers model once; :meth:`check` per mismatch."""

    def __init__(self, model_dir: Path, engine: EngineConfig) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        from workers.engine.engine import Engine

        self.torch = torch
        self.engine = Engine(engine)
        self.hf: Any = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)

    def _greedy(self, prompt: list[int], n: int) -> list[int]:
        params = SamplingParams(max_tokens=n, temperature=0, ignore_eos=True)
        return list(self.engine.generate([prompt], params)[0].output_token_ids)

    def _top2(self, ids: list[int]) -> tuple[list[int], float]:
        with self.torch.no_grad():
            logits = self.hf(self.torch.tensor([ids])).logits[0, -1]
        top = self.torch.topk(logits, 2)
        return [int(i) for i in top.indices], float(top.values[0] - top.values[1])

    def _diverges(self, ids: list[int], served: str) -> int:
        decode = self.engine.tokenizer.decode
        return next(
            (k for k in range(len(ids)) if not served.startswith(decode(ids[: k + 1]))),
            len(ids),
        )

    def check(self, req: ChaosRequest, served: str) -> Verdict:
        prompt = list(req.prompt)
        ids = self._greedy(prompt, req.max_tokens)
        for ties in range(MAX_TIES + 1):
            if self.engine.tokenizer.decode(ids) == served:
                return Verdict(True, ties)
            k = self._diverges(ids, served)
            if k >= len(ids):
                return Verdict(False, ties)
            best, gap = self._top2(prompt + ids[:k])
            if gap > TIE_EPS or ids[k] not in best:
                return Verdict(False, ties, gap)
            other = best[1] if best[0] == ids[k] else best[0]
            left = req.max_tokens - k - 1
            tail = self._greedy(prompt + ids[:k] + [other], left) if left else []
            ids = [*ids[:k], other, *tail]
        return Verdict(False, MAX_TIES)
