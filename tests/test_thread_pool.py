"""Thread pool: a model's graphs share onnxruntime's process-wide pool.

Speculative rounds alternate between graphs (draft and full, or head@k and tail@k); with a
pool per session the idle pools spin on the cores the running graph needs.
"""

from __future__ import annotations

import edgespec


def test_all_graphs_of_a_speculative_model_share_one_pool(spec_bundles) -> None:
    for mode, options in [("spec", {}), ("self-spec", {"exit_layer": 2})]:
        model = edgespec.load(spec_bundles["llama-gqa-tied"], mode=mode, threads=2, **options)
        drafter = model.drafter
        graphs = [*model.target.stages]
        graphs += drafter.model.stages if mode == "spec" else [*drafter.heads.values()]
        assert len(graphs) >= 2
        for graph in graphs:
            assert graph.session.get_session_options().use_per_session_threads is False
