"""Patches of vLLM's V1 model runner (``vllm.v1.worker.gpu_model_runner``; the CPU
runner subclasses it): ARRoL's capture of the hidden rows, the DAS drafter's step
context, and DAS's drafting between steps under async scheduling."""
