"""The plugin API: every name a slotwise plugin may import, from this one module.

    from slotwise.plugin_api import Platform, PlatformSpec, hookimpl, GraphAPI

Everything here is covered by ``API_VERSION`` and the policy in docs/api-versioning.md;
anything a plugin imports from elsewhere in ``slotwise`` may change without notice. A
snapshot test (tests/versioning/test_plugin_api_surface.py) fails when a name or a
signature here changes without a matching ``API_VERSION`` change.

Names load on first access, so a plugin's platform module can import this module at its
top without importing torch: resolving a platform stays cheap.
"""

from __future__ import annotations

from slotwise.lazy_exports import lazy_exports

#: Public name -> the module that defines it.
_EXPORTS: dict[str, str] = {
    # versions and errors
    "API_VERSION": "slotwise.version",
    "SlotwiseError": "slotwise.errors",
    "RegistryError": "slotwise.platforms.registries",
    # declaring platforms (plugins, platforms)
    "hookimpl": "slotwise.plugins.markers",
    "PlatformSpec": "slotwise.platforms.spec",
    "Platform": "slotwise.platforms.interface",
    # compilation: what check_and_update_config adjusts, and the piecewise backends
    "CompilationConfig": "slotwise.compilation.config",
    "CompilationLevel": "slotwise.compilation.config",
    "GraphMode": "slotwise.graph_mode",
    "AbstractPiecewiseBackend": "slotwise.compilation.splitting.piecewise_backend",
    "CompiledPiecewiseBackend": "slotwise.compilation.splitting.piecewise_backend",
    # static graphs
    "GraphAPI": "slotwise.compilation.static_graphs.graph_api",
    "StaticGraph": "slotwise.compilation.static_graphs.graph_api",
    "weak_ref_tensors": "slotwise.compilation.static_graphs.graph_api",
    "RecordedGraphAPI": "slotwise.compilation.static_graphs.recorded_graph",
    "RecordedGraph": "slotwise.compilation.static_graphs.recorded_graph",
    "StaticGraphError": "slotwise.compilation.static_graphs.contract",
    "input_addresses": "slotwise.compilation.static_graphs.contract",
    "check_input_addresses": "slotwise.compilation.static_graphs.contract",
    "StaticGraphPiecewiseBackend": "slotwise.compilation.splitting.piecewise_backend",
    "ForwardContext": "slotwise.forward_context",
    "try_get_forward_context": "slotwise.forward_context",
    "set_forward_context": "slotwise.forward_context",
    # attention
    "Attention": "slotwise.attention.layer",
    "AttentionBackend": "slotwise.attention.backend",
    "AttentionImpl": "slotwise.attention.impl",
    "AttentionMetadata": "slotwise.attention.metadata",
    "AttentionMetadataBuilder": "slotwise.attention.metadata",
    "MetadataBuffers": "slotwise.attention.metadata",
    "BatchSplit": "slotwise.attention.metadata",
    "GraphSupport": "slotwise.attention.backend",
    "AttentionBackendRegistry": "slotwise.attention.registry",
    "write_to_kv_cache": "slotwise.attention.kv_cache",
    # custom ops and the layers plugins replace
    "CustomOp": "slotwise.custom_op",
    "CustomOpRegistry": "slotwise.custom_op",
    "RMSNorm": "slotwise.layers.layernorm",
    "norm_with_residual": "slotwise.layers.layernorm",
    "SiluAndMul": "slotwise.layers.activation",
    "RotaryEmbedding": "slotwise.layers.rotary_embedding",
    "LogitsHead": "slotwise.layers.logits",
    # distributed
    "Communicator": "slotwise.distributed.communicator",
    # a plugin's own cache under the core's cache root, under the core's trust rules
    "untrusted_directory": "slotwise.cache_permissions",
    "make_private_directories": "slotwise.cache_permissions",
    "read_trusted_file": "slotwise.cache_permissions",
    "write_atomically": "slotwise.cache_permissions",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(
    __name__,
    _EXPORTS,
    unknown=f"slotwise.plugin_api has no {{name}}; the plugin API is: {', '.join(__all__)}",
)
