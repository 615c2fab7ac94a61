"""In-engine rules, one module per technique."""
from __future__ import annotations

import hashlib
import random


def seeded_uniform(salt: str, seed: int | None, prompt_token_ids, request_id: str) -> float:
    """A uniform number in [0, 1), fresh randomness independent of the generated tokens:
    from the request's seed and prompt when it is seeded (each child of an ``n > 1``
    request has its own seed; requests sharing a seed across prompts still differ), else
    from its (random) request id.  ``salt`` keeps each technique's coin independent."""
    h = hashlib.blake2b(digest_size=8)
    if seed is None:
        h.update(f"{salt}:{request_id}".encode())
    else:
        h.update(f"{salt}:{seed}:".encode())
        h.update(",".join(map(str, prompt_token_ids or ())).encode())
    return random.Random(int.from_bytes(h.digest(), "little")).random()
