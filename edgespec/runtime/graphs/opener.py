"""One bundle opener for everything that runs graphs: the app's `Model` and the server.

`open_bundle(folder, ...)` validates the manifest and returns `BundleGraphs`: the manifest,
the folder, and `open(role)` -> a graph session of that role on the chosen device profile
and threads — an onnxruntime `GraphSession`, a `StaticGraphSession` (fixed shapes, NPUs) or
a `CoreMLSession`, all `protocol.Graph`s. Each role is opened once per
`BundleGraphs`: whoever asks for it again gets the same session (the server's split verifier
and its OpenAI engine hold one copy of the target's weights, not two).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import numpy as np

from edgespec.bundle import BundleError, GraphInfo, Manifest, load_manifest
from edgespec.devices import Profile, get_profile
from edgespec.runtime.graphs import huge_pages
from edgespec.runtime.graphs.coreml import open_coreml
from edgespec.runtime.graphs.protocol import Graph
from edgespec.runtime.graphs.session import GraphSession, session_options
from edgespec.runtime.graphs.static import StaticGraphSession
from edgespec.runtime.graphs.tree_verify import TreeGraph, TreeGraphSession
from edgespec.runtime.tokenizer import Tokenizer

S = TypeVar("S", bound=GraphSession)


@dataclass
class GraphOptions:
    device: str = "cpu"
    threads: int | None = None
    shared_threads: bool = True
    static: bool = False
    coreml: bool = False
    huge_pages: bool = True  # back the opened graphs' memory with 2 MiB pages (huge_pages.py)


class BundleGraphs:
    """A validated bundle and a way to open its graphs on one device."""

    def __init__(self, folder: Path, manifest: Manifest, profile: Profile, options: GraphOptions):
        if options.static and options.coreml:
            raise BundleError("choose static graphs (ONNX for NPUs) or Core ML, not both")
        self.folder, self.manifest, self.profile, self.options = folder, manifest, profile, options
        if options.coreml and manifest.coreml is None:
            raise BundleError(
                f"bundle {folder} has no Core ML packages; re-export it with "
                "`edgespec export MODEL --out FOLDER --coreml` (needs the [coreml] extra)"
            )
        if options.static and manifest.static is None:
            raise BundleError(
                f"bundle {folder} has no static graphs; re-export it with "
                "`edgespec export MODEL --out FOLDER --static --max-context 512 --verify-width 8`"
            )
        self._providers = profile.session_providers()
        self._session_options = session_options(options.threads, options.shared_threads)
        profile.apply_session_options(self._session_options)
        self.kv_dtype = np.dtype(np.float16 if manifest.dtype == "fp16" else np.float32)
        self.opened: dict[str, Graph] = {}

    def open(self, role: str) -> Graph:
        """role -> a session (GraphSession, or StaticGraphSession / CoreMLSession); the same
        one each time the role is asked for."""
        if role not in self.opened:
            hugify = self.options.huge_pages and not self.options.coreml
            before = huge_pages.snapshot() if hugify else {}
            self.opened[role] = self._open(role)
            if hugify:  # the memory the session just took: its weights (best effort)
                huge_pages.collapse(before)
        return self.opened[role]

    def _open(self, role: str) -> Graph:
        m = self.manifest
        if role.startswith("tree:"):  # see open_tree
            return self._open_tree(role.removeprefix("tree:"))
        if self.options.coreml:
            variants = m.coreml
            assert variants is not None
            package = variants.package(role)
            return open_coreml(self.folder, package, m.model_info(package), variants)
        if self.options.static:
            statics = m.static
            assert statics is not None
            graphs = statics.graphs_for(role)
            return StaticGraphSession(
                self.folder,
                graphs,
                m.model_info(next(iter(graphs.values()))),
                self._providers,
                self._session_options,
                self.kv_dtype,
                statics.max_context,
            )
        return self._session(GraphSession, m.graph(role))

    def open_tree(self, role: str) -> TreeGraph:
        """role -> its tree-verification twin (opened once, as `open` opens a role), or a
        BundleError saying why this bundle, or these graphs, cannot verify token trees."""
        if self.options.coreml:
            raise BundleError(
                "Core ML packages cannot verify token trees: their attention has no "
                "mask input; drop the tree drafter, or run the ONNX graphs"
            )
        if self.options.static:  # their position and mask inputs take a tree as it is
            static = self.open(role)
            assert isinstance(static, StaticGraphSession)
            return static
        session = self.open(f"tree:{role}")
        assert isinstance(session, TreeGraphSession)
        return session

    def _open_tree(self, role: str) -> TreeGraphSession:
        m = self.manifest
        graph = next((g for g in m.tree_graphs if g.role == role), None)
        if graph is None:
            raise BundleError(
                f"bundle {self.folder} has no tree-verification graph for '{role}'; "
                "re-export it with `edgespec export MODEL --out FOLDER --tree-verify`"
            )
        return self._session(TreeGraphSession, graph)

    def _session(self, kind: type[S], graph: GraphInfo) -> S:
        """An onnxruntime session of `kind` over one graph of the manifest."""
        info = self.manifest.model_info(graph)
        return kind(self.folder, graph, info, self._providers, self._session_options, self.kv_dtype)

    def tokenizer(self) -> Tokenizer:
        return Tokenizer.from_dir(self.folder)


def open_bundle(bundle: str | os.PathLike, options: GraphOptions | None = None) -> BundleGraphs:
    folder = Path(bundle)
    manifest = load_manifest(folder)
    options = options or GraphOptions()
    return BundleGraphs(folder, manifest, get_profile(options.device), options)
