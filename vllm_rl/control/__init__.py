"""Trainer-side controllers (pure Python, no vLLM import), one module per technique."""
