"""The ``verl.plugins`` entry point: importing this module registers vllm_rl with verl.

verl imports every ``verl.plugins`` entry in each process that imports verl and logs a
failure only at DEBUG level; here the failure is logged at WARNING with its cause, then
raised as verl expects.
"""
import logging

from vllm_rl.integrations.verl import register

try:
    register()
except Exception:
    logging.getLogger("vllm_rl.integrations.verl").warning(
        "vllm_rl could not register with verl; rollout.name=vllm_rl will be unknown",
        exc_info=True)
    raise
