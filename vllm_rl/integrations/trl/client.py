"""TRL's server mode (``GRPOConfig(use_vllm=True, vllm_mode="server")``) against ``vllm-rl serve``.

TRL's ``VLLMClient`` posts token-id prompts to ``/v1/completions`` (one ``n =
num_generations`` request per prompt) and merges ``generation_kwargs`` into the body, so
``generation_kwargs={"vllm_xargs": vllm_rl.rl_xargs(...)}`` reaches the engine's flags
unchanged; it keeps only token ids and log-probs.  :class:`RLVLLMClient` is the same
client that also keeps each choice's record (``last_records``: one
:class:`~vllm_rl.outcome.RolloutInfo` per completion, in the order of
``completion_ids``), and :meth:`RLVLLMClient.generate` returns them under ``"records"``,
with the hidden states they name (ARRoL's ``return_hidden``) taken from the server in one
``POST /vllm_rl/arrol/hidden`` (:meth:`RLVLLMClient.arrol_hidden`).
Serve with ``vllm-rl serve MODEL`` (TRL's ``trl vllm-serve`` runs stock ``vllm serve``).
TRL's weight sync in server mode is NCCL (``init_communicator``): GPU only.
"""
from __future__ import annotations

from vllm_rl.compat import vllm_version_shim

vllm_version_shim()

from trl.generation.vllm_client import VLLMClient  # noqa: E402

from vllm_rl.outcome import RolloutInfo, decode_hidden, hidden_ids, with_hidden  # noqa: E402


class RLVLLMClient(VLLMClient):
    """``VLLMClient`` that keeps the records of the completions it returns."""

    last_records: list[RolloutInfo] = []

    def _post(self, url: str, **kwargs) -> dict:
        out = super()._post(url, **kwargs)
        if url.endswith("/v1/completions") and isinstance(out, dict) and "choices" in out:
            self.last_records = [RolloutInfo.from_openai_choice(c) for c in out["choices"]]
        return out

    def generate(self, *args, **kwargs) -> dict:
        out = super().generate(*args, **kwargs)
        records = list(self.last_records)
        ids = hidden_ids(records)
        if ids:
            records = with_hidden(records, self.arrol_hidden(ids))
        self.last_records = records
        out["records"] = records
        return out

    def arrol_hidden(self, request_ids: list[str]) -> dict:
        """The hidden states the server kept for these records (their ``hidden_id``):
        request id -> float32 numpy vector; ids not kept are absent."""
        out = self._post(f"{self.base_url}/vllm_rl/arrol/hidden",
                         json={"request_ids": list(request_ids)})
        return {rid: decode_hidden(text) for rid, text in out["hidden"].items()}
