"""Draft-length policies: how many tokens to draft each round (and where, and as a chain or a
tree), from what a round is expected to yield and cost."""
