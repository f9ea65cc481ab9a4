"""`edgespec distill`: a feature head (EAGLE style, export/eagle.py) for a model that has no draft,
trained on the CPU from the target's own replies. The [distill] extra (torch).

`distill(target, out, config)` (pipeline.py) exports the target with its features declared,
has it answer the built-in prompts (prompts.py) through the edgespec runtime (data.py), trains
the head within the time budget (head.py, train.py), resumable from the checkpoint it keeps
in the bundle, and writes the head into the bundle. Only `prompts` is importable without
torch.
"""
