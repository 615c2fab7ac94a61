"""In-engine rules, one module per technique."""
