"""DAS, distribution-aware speculative decoding for RL rollouts ("Beat the Long Tail",
Shao, Srivatsa et al.): lossless drafting from a per-problem suffix tree of recent
rollouts, with draft budgets set by length class (short / medium / long), Eq. 7, or the
step-cost curve.

- :mod:`.tree`: the Python face of the C++ suffix tree (``vllm_rl._C``, ``csrc/``);
- :mod:`.store`: one tree per problem, a sliding window of rollouts, a global token cap;
- :mod:`.drafter`: :class:`~.drafter.DASProposer`, vLLM's ``custom_class`` proposer, and
  its parts: :mod:`.requests` (admission, counts, sealing), :mod:`.draft_lengths` (budgets and
  the batch cap), :mod:`.async_drafts` (drafting under async scheduling, the lookahead,
  with :mod:`.hypotheses`: the drafts for each outcome of the step in flight, and
  :mod:`.async_steps`: the step in flight and what crosses to vLLM's runner), their
  state in :mod:`.state`;
- :mod:`.engine`: :class:`~.engine.DasEngine`, DAS's state in the RL scheduler;
- :mod:`.request_columns`: the drafter's running requests as numpy columns (one batched step);
- :mod:`.budget_model`: the budget model (Eq. 3-7) and the acceptance estimates;
- :mod:`.length_classes`: the length classes (Sec. 4.2.3);
- :mod:`.batch_caps`: where drafting pays by batch size (Sec. 4.2.1, the step-cost model);
- :mod:`.config`: :class:`~.config.DASConfig` and the engine keywords it implies;
- :mod:`.worker`: ``das_prebuild`` / ``das_clear`` / ``das_stats`` / ``das_phase``.

The public names of these modules are importable from the package itself, lazily: this
package imports neither vLLM nor the compiled extension until a name is asked for.
"""
from __future__ import annotations

from vllm_rl.lazy import exports

__getattr__ = exports(__name__, ("tree", "budget_model", "batch_caps", "store", "config"))
