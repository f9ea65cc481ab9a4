"""Drafters: where proposed tokens come from (a model, an early exit, a feature head, prompt
lookup, suffix trees, recycled candidates), chains and trees of them."""
