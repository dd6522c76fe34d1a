"""``load_model``: a Hugging Face checkpoint folder as a slotwise model.

config.json picks the architecture (``registry``) and its shape (``HFConfig``); the
model is built without weights (``LlamaForCausalLM.empty``); every checkpoint
tensor is matched to the parameter it fills, checked against it from the file
headers alone (names, shapes, dtypes), and only then read, each rank indexing
just its slice.  Loading thus costs about the time to read the bytes, and a bad
checkpoint fails before any is read, with one ``CheckpointError``.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from torch import nn

from slotwise.attention.selector import AttentionBackendError
from slotwise.distributed import state as distributed_state
from slotwise.platforms import get_current_platform
from slotwise_engine.models.checkpoint import FLOAT_DTYPES, Checkpoint, CheckpointTensor
from slotwise_engine.models.checkpoint_agreement import check_checkpoint_agreement
from slotwise_engine.models.errors import CheckpointError
from slotwise_engine.models.hf_config import DTYPES, HFConfig
from slotwise_engine.models.llama import LlamaConfig, LlamaForCausalLM
from slotwise_engine.models.registry import model_class

logger = logging.getLogger(__name__)

#: Elements of each tensor held at once while two checkpoint tensors are compared.
_COMPARED_ELEMENTS = 1 << 22


def load_model(
    path: str | Path,
    *,
    dtype: torch.dtype | str | None = None,
    device: torch.device | str | None = None,
    compilation_config: object = None,
    max_model_len: int | None = None,
) -> LlamaForCausalLM:
    """The model saved in folder ``path`` (config.json and safetensors files).

    ``dtype``: the weights' dtype (default: config.json's ``dtype``, else float32);
    ``device``: default the current platform's; ``max_model_len``: the longest request
    (prompt and continuation) to serve, which sizes the rotary table (default: the
    context config.json allows).  Under tensor parallelism (``init_distributed``) each
    rank reads only its shard of the weights.
    """
    start = time.perf_counter()
    folder = Path(path)
    check_checkpoint_agreement(folder)  # first: the ranks' shapes may differ
    hf = HFConfig.read(folder)
    cls = model_class(hf)
    config = _served(cls.config_from_hf(hf), max_model_len, hf)
    dtype = _model_dtype(dtype, hf)
    _check_tensor_parallel(hf, config)
    with Checkpoint(folder) as checkpoint:
        config = _tied_as_stored(config, cls, checkpoint, dtype)
        try:
            model = cls.on_meta(config, dtype=dtype, compilation_config=compilation_config)
        except AttentionBackendError as exc:
            raise CheckpointError(
                f"{folder}: the platform cannot run this model's attention in {dtype} "
                f"(head_dim {config.head_size}); pass load_model(..., dtype=...) with a dtype "
                f"it supports: {exc}"
            ) from exc
        check_weights(model, checkpoint)  # before any memory: sizes come from config.json
        model.materialize(device or get_current_platform().device_type)
        # Before the weights are written: memory the platform maps its own way from the
        # first write on costs nothing to move.
        get_current_platform().advise_resident_memory([*model.parameters(), *model.buffers()])
        load_weights(model, checkpoint)
    seconds = time.perf_counter() - start
    logger.info(
        "loaded %s from %s in %.2f s (%.2f GB read, %.2f GB/s)",
        cls.__name__,
        folder,
        seconds,
        checkpoint.bytes_read / 1e9,
        checkpoint.bytes_read / 1e9 / seconds,
    )
    return model


def _served(config: LlamaConfig, max_model_len: int | None, hf: HFConfig) -> LlamaConfig:
    """``config`` limited to ``max_model_len`` tokens, which must fit its context."""
    if max_model_len is None:
        return config
    if (
        not isinstance(max_model_len, int)
        or isinstance(max_model_len, bool)
        or not 1 <= max_model_len <= config.max_position
    ):
        raise CheckpointError(
            f"max_model_len {max_model_len!r} is not an integer from 1 to "
            f"{config.max_position}, the context {hf.path} allows; pass one in that range"
        )
    return replace(config, max_position=max_model_len)


def _tied_as_stored(
    config: LlamaConfig, cls: type[LlamaForCausalLM], checkpoint: Checkpoint, dtype: torch.dtype
) -> LlamaConfig:
    """``config`` untied where the checkpoint stores an LM head unlike the embeddings.

    transformers ties the two (``tie_word_embeddings``) only where the checkpoint
    stores at most one of them, or both with equal values in the model's dtype;
    otherwise each keeps its own, and so does slotwise, with one warning.
    """
    head, embeddings = cls.tied_tensors
    if not config.tie_word_embeddings or not {head, embeddings} <= checkpoint.files.keys():
        return config
    if _equal_tensors(checkpoint, head, embeddings, dtype):
        return config
    logger.warning(
        "%s: config.json ties the LM head to the embeddings (tie_word_embeddings), but the "
        "checkpoint stores an %s unlike %s; as in transformers, each keeps its own weights "
        "(set tie_word_embeddings to false to say so)",
        checkpoint.folder,
        head,
        embeddings,
    )
    return replace(config, tie_word_embeddings=False)


def _equal_tensors(checkpoint: Checkpoint, first: str, second: str, dtype: torch.dtype) -> bool:
    """Whether two checkpoint tensors hold the same values in ``dtype``, compared a
    block of rows at a time so no whole copy of either is made."""
    a, b = checkpoint.tensor(first), checkpoint.tensor(second)
    if a.shape != b.shape or not a.shape or not {a.dtype, b.dtype} <= set(FLOAT_DTYPES):
        return False  # check_weights names the tensor that is wrong
    rows = max(1, _COMPARED_ELEMENTS // max(1, math.prod(a.shape[1:])))
    return all(
        torch.equal(a[start : start + rows].to(dtype), b[start : start + rows].to(dtype))
        for start in range(0, a.shape[0], rows)
    )


def check_weights(model: LlamaForCausalLM, checkpoint: Checkpoint) -> None:
    """Check every tensor's name, shape and dtype from the file headers alone; ``model``
    may still be on the meta device."""
    targets = _targets(model, checkpoint)
    _check_names(model, checkpoint, targets)
    for name, target in targets.items():
        _check_tensor(checkpoint.tensor(name), target.shape())


def load_weights(model: LlamaForCausalLM, checkpoint: Checkpoint) -> None:
    """Fill every parameter of ``model`` from ``checkpoint``: all tensors are checked
    first, then each is read, this rank's slice only."""
    check_weights(model, checkpoint)
    targets = _targets(model, checkpoint)
    tensors = {name: checkpoint.tensor(name) for name in checkpoint.files}
    with torch.no_grad():
        for name in sorted(targets, key=lambda n: (checkpoint.files[n], n)):
            targets[name].load(tensors[name])


@dataclass(frozen=True)
class _Target:
    """Where one checkpoint tensor goes: parameter ``param`` of ``module``, or its part
    ``part`` when the module fuses several checkpoint modules."""

    module: nn.Module
    param: str
    part: int

    def shape(self) -> tuple[int, ...]:
        if hasattr(self.module, "full_shape"):  # a tensor-parallel layer: unsharded shape
            return tuple(self.module.full_shape(self.param, self.part))
        return tuple(getattr(self.module, self.param).shape)

    def load(self, tensor: CheckpointTensor) -> None:
        if hasattr(self.module, "load_shard"):
            self.module.load_shard(self.param, tensor, self.part)
        else:
            tensor.copy_to(getattr(self.module, self.param))


def _targets(model: LlamaForCausalLM, checkpoint: Checkpoint) -> dict[str, _Target]:
    """The checkpoint name of every parameter (each fused one under its parts' names);
    a tied parameter is named once, by the module that comes first, unless only the
    other's tensor is stored (transformers then ties to that one)."""
    targets: dict[str, _Target] = {}
    seen: set[int] = set()
    for module_name, module in model.named_modules():
        parent, _, leaf = module_name.rpartition(".")
        for param_name, param in module.named_parameters(recurse=False):
            if id(param) in seen:
                continue
            seen.add(id(param))
            for part, part_leaf in enumerate(model.fused_modules.get(leaf, (leaf,))):
                name = ".".join(filter(None, (parent, part_leaf, param_name)))
                targets[name] = _Target(module, param_name, part)
    head, embeddings = model.tied_tensors
    stored = checkpoint.files
    if model.config.tie_word_embeddings and embeddings not in stored and head in stored:
        targets[head] = targets.pop(embeddings)
    return targets


def _check_names(
    model: LlamaForCausalLM, checkpoint: Checkpoint, targets: dict[str, _Target]
) -> None:
    architecture = type(model).__name__
    missing = [name for name in targets if name not in checkpoint.files]
    if missing:
        raise CheckpointError(
            f"{checkpoint.folder}: missing tensor(s) {_few(missing)}, which {architecture} "
            "as config.json describes it needs; check that config.json belongs to these "
            "weights (num_hidden_layers, attention_bias, tie_word_embeddings, ...)"
        )
    unexpected = [
        f"{name} (in {checkpoint.files[name].name})"
        for name in checkpoint.files
        if name not in targets and not model.is_redundant_tensor(name)
    ]
    if unexpected:
        raise CheckpointError(
            f"{checkpoint.folder}: unexpected tensor(s) {_few(unexpected)}, which "
            f"{architecture} as config.json describes it has no place for; check that "
            "config.json belongs to these weights (architectures, num_hidden_layers, "
            "attention_bias, ...)"
        )


def _check_tensor(tensor: CheckpointTensor, expected: tuple[int, ...]) -> None:
    if tensor.shape != expected:
        raise CheckpointError(
            f"{tensor.file}: tensor {tensor.name} has shape {list(tensor.shape)}, expected "
            f"{list(expected)} from config.json; the weights and config.json disagree "
            "(hidden_size, num_key_value_heads, head_dim, vocab_size, ...)"
        )
    if tensor.dtype not in FLOAT_DTYPES:
        raise CheckpointError(
            f"{tensor.file}: tensor {tensor.name} is stored as {tensor.dtype}; slotwise loads "
            f"unquantized floating-point weights ({', '.join(FLOAT_DTYPES)})"
        )


def _few(names: list[str], shown: int = 5) -> str:
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


def _model_dtype(dtype: torch.dtype | str | None, hf: HFConfig) -> torch.dtype:
    if isinstance(dtype, str):
        if dtype not in DTYPES:
            raise CheckpointError(f"dtype {dtype!r} is not supported; use one of {list(DTYPES)}")
        dtype = DTYPES[dtype]
    dtype = dtype or hf.dtype() or torch.float32
    if not dtype.is_floating_point:
        raise CheckpointError(
            f"dtype {dtype} is not a floating-point dtype; use one of {list(DTYPES)}"
        )
    return dtype


def _check_tensor_parallel(hf: HFConfig, config: LlamaConfig) -> None:
    """Refuse a tensor-parallel size the heads or the MLP cannot be split over."""
    tp = distributed_state.get_tensor_parallel_world_size()
    kv = config.num_kv_heads
    problems = [
        f"{field} ({value})"
        for field, value, fits in (
            ("num_attention_heads", config.num_heads, config.num_heads % tp == 0),
            ("num_key_value_heads", kv, (kv % tp if kv >= tp else tp % kv) == 0),
            ("intermediate_size", config.intermediate_size, config.intermediate_size % tp == 0),
        )
        if not fits
    ]
    if problems:
        raise hf.error(
            f"{', '.join(problems)} cannot be split over tensor-parallel size {tp}; use a "
            "size that divides num_attention_heads and intermediate_size and that divides "
            "num_key_value_heads or is a multiple of it"
        )
