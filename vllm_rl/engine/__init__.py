"""vLLM's scheduler on the RL engine: :mod:`.scheduler` (the RL schedulers, composing the
techniques' rules), :mod:`.groups` (per-request and per-group state) and :mod:`.trace`
(the step trace).  Importing this package imports no vLLM."""

TRACE_KEY = "vllm_rl_trace"    # additional_config: record each engine step (.trace)

__all__ = ["TRACE_KEY"]
