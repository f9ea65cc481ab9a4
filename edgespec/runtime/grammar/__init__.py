"""Constrained decoding: grammars on llguidance, the token-mask contract the loop, drafters and
verifiers share, and JSON read as it streams."""
