"""``ModelRunner``: runs a causal LM step by step over a paged KV cache.

It owns what a model should not: the KV cache and its block allocator, each step's
inputs and attention metadata (written into persistent buffers, ``StepInputs``, and
sent to the device in one copy per storage), padding batches to the size the model's
``GraphDispatcher`` gives (graphs read those buffers in place; FULL graphs also their
attention metadata, laid out there), capturing the dispatcher's capture plan at
start-up; generation and serving run on top of it (slotwise_engine.serving).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from slotwise.attention import (
    Attention,
    AttentionMetadata,
    BlockAllocator,
    StaticAttentionMetadata,
    allocate_kv_caches,
    num_blocks_for,
)
from slotwise.attention.metadata import AttentionMetadataBuilder, next_step
from slotwise.compilation.compiled_modules import compiled_forward_of
from slotwise.compilation.config import CompilationConfig, GraphMode
from slotwise.compilation.static_graphs.dispatcher import (
    CaptureCase,
    GraphDispatcher,
    MetadataLayout,
    StepGraphs,
)
from slotwise.compilation.static_graphs.graph_modes import sizes_padding_never_reaches
from slotwise.compilation.static_graphs.recorded_step import (
    NotReady,
    NotRecordable,
    RecordedStep,
    record_step,
)
from slotwise.forward_context import set_forward_context
from slotwise.platforms import get_current_platform
from slotwise_engine.runner.capture import CaptureReport, capture_graphs
from slotwise_engine.runner.step_inputs import StepBuffers, StepInputs

logger = logging.getLogger(__name__)

#: Step shapes whose dispatch is remembered (a step's token count, uniform or not).
_MAX_DISPATCHED = 4096


@dataclass
class Request:
    """One request: its tokens so far and the cache blocks holding them."""

    tokens: list[int]
    block_ids: list[int]
    num_cached: int = 0


class ModelRunner:
    """Runs ``model`` (a ``LlamaForCausalLM``-like module with ``forward(input_ids,
    positions)`` and ``compute_logits(hidden)``) on the current platform.

    ``max_model_len`` bounds the tokens of one request (prompt and continuation);
    by default the model's ``config.max_position``, else the whole cache.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        num_blocks: int = 256,
        device: torch.device | str | None = None,
        max_model_len: int | None = None,
    ) -> None:
        self.model = model
        self.platform = get_current_platform()
        self.device = torch.device(device or self.platform.device_type)
        layers = [m for m in model.modules() if isinstance(m, Attention)]
        if not layers:
            raise ValueError(f"{type(model).__name__} has no slotwise Attention layer")
        self.block_size = layers[0].block_size
        model_config = getattr(model, "config", None)
        #: None for a model without ``config.vocab_size``: its token ids go unchecked.
        self.vocab_size: int | None = getattr(model_config, "vocab_size", None)
        self.max_model_len = (
            max_model_len
            or getattr(model_config, "max_position", None)
            or num_blocks * self.block_size
        )
        allocate_kv_caches(model, num_blocks, device=self.device)
        # The weights every step reads, for the platform to map as its memory reads
        # fastest (load_model did already; a model built otherwise has not been).
        self.platform.advise_resident_memory([*model.parameters(), *model.buffers()])
        self.allocator = BlockAllocator(num_blocks, self.block_size)
        self.metadata_builder: AttentionMetadataBuilder = layers[0].attn_backend.get_builder_cls()(
            self.block_size, self.device
        )
        self.config = compiled_config(model)
        self.dispatcher = GraphDispatcher(
            self.config, self.platform, [layer.attn_backend for layer in layers]
        )
        self.capture_sizes = self._graph_sizes()
        #: The most blocks one request may hold: the block tables' fixed width.
        self.max_blocks_per_request = min(
            num_blocks, num_blocks_for(self.max_model_len, self.block_size)
        )
        self.step_inputs = StepInputs(
            self.capture_sizes[-1] if self.capture_sizes else 0,
            self.max_blocks_per_request,
            self.block_size,
            self.max_model_len,
            self.device,
        )
        self.static_metadata = self._static_metadata()
        self._dispatched: dict[tuple[int, bool], StepGraphs] = {}
        #: Uniform decode steps of captured sizes, recorded as lists of calls
        #: (``recorded_step``); None once the model's step proved unrecordable.
        self.recorded_steps: dict[StepGraphs, RecordedStep] | None = {}

    def _graph_sizes(self) -> list[int]:
        """The sizes steps are padded to (the dispatcher's); empty when this model runs
        without graphs: its settled graph mode is NONE wherever nothing is captured (no
        compilation, ``TORCH_COMPILE_DISABLE=1``, nothing to capture)."""
        sizes = self.dispatcher.capture_sizes
        if not sizes:
            return []
        assert self.config is not None
        unreached = sizes_padding_never_reaches(self.config)
        if unreached:
            logger.warning(
                "compilation config key 'compile_sizes': %s are never a step's size, since "
                "the runner pads every step of up to %d tokens to a capture size (%s); list "
                "capture sizes there, or sizes above %d",
                unreached,
                sizes[-1],
                sizes,
                sizes[-1],
            )
        return sizes

    def _static_metadata(self) -> StaticAttentionMetadata | None:
        """The layouts of FULL steps over the step inputs' graph buffers, whose padding
        requests decode into a cache block reserved here for the runner's lifetime; None
        without full graphs."""
        graph = self.step_inputs.graph
        if graph is None or not self.dispatcher.graph_mode.has_full_graphs:
            return None
        (scratch_block,) = self.allocator.allocate(1)
        return StaticAttentionMetadata(
            graph.max_tokens,
            self.max_blocks_per_request,
            self.block_size,
            scratch_block,
            self.device,
            buffers=graph.metadata,
        )

    # -- steps ---------------------------------------------------------------------

    def padded_size(self, num_tokens: int) -> int:
        """The smallest capture size holding ``num_tokens``, or ``num_tokens`` itself
        when it is larger than every capture size (or graphs are off)."""
        return self.dispatcher.dispatch(num_tokens).padded_size

    def execute(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        metadata: AttentionMetadata | None,
        *,
        uniform_decode: bool = False,
    ) -> torch.Tensor:
        """Hidden states of one step for its ``len(input_ids)`` real tokens, from tensors
        the caller made (``step`` writes its inputs in place instead): they are copied
        into the graph buffers, and ``metadata`` into the static layout of a FULL step."""
        num_tokens = input_ids.shape[0]
        graphs = self.dispatcher.dispatch(num_tokens, uniform_decode)
        if graphs.mode != GraphMode.NONE:
            buffers = self.step_inputs.graph
            assert buffers is not None
            # The copies below bypass the host arrays: their rows are stale from here.
            buffers.forget_contents()
            padded = graphs.padded_size
            for source, target in ((input_ids, buffers.input_ids), (positions, buffers.positions)):
                target[:num_tokens].copy_(source)
                target[num_tokens:padded].zero_()
            input_ids, positions = buffers.input_ids[:padded], buffers.positions[:padded]
            if graphs.metadata_layout != MetadataLayout.AS_BUILT:
                assert self.static_metadata is not None
                lay_out = (
                    self.static_metadata.uniform_decode
                    if graphs.metadata_layout == MetadataLayout.UNIFORM_DECODE
                    else self.static_metadata.general
                )
                metadata = lay_out(padded, metadata)
        return self._run(graphs, input_ids, positions, metadata)[:num_tokens]

    def _run(
        self,
        graphs: StepGraphs,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        metadata: AttentionMetadata | None,
    ) -> torch.Tensor:
        """The model on inputs of ``graphs.padded_size`` rows, in the step's forward
        context: the dispatcher's decision, carried there for the graph wrappers."""
        with (
            contextlib.nullcontext()
            if torch.is_inference_mode_enabled()
            else torch.inference_mode(),
            set_forward_context(
                metadata, graph_mode=graphs.mode, batch_descriptor=graphs.batch_descriptor
            ),
        ):
            return self.model(input_ids, positions)

    def _dispatch(self, num_tokens: int, uniform_decode: bool) -> StepGraphs:
        """The dispatcher's decision for a step, asked once per step shape."""
        graphs = self._dispatched.get((num_tokens, uniform_decode))
        if graphs is None:
            graphs = self.dispatcher.dispatch(num_tokens, uniform_decode)
            if len(self._dispatched) < _MAX_DISPATCHED:
                self._dispatched[num_tokens, uniform_decode] = graphs
        return graphs

    def capture(self, *, progress: bool = True) -> list[CaptureReport]:
        """Capture every graph of the dispatcher's capture plan (no-op without graphs)."""
        plan = self.dispatcher.capture_plan()
        if not plan or self.config is None:
            return []
        zeros = torch.zeros(self.capture_sizes[-1], dtype=torch.long, device=self.device)

        def run_case(case: CaptureCase) -> None:
            # A step without real requests is enough: pieces never contain attention
            # (without metadata the op only zero-fills its output), and a full graph
            # captures attention over the static metadata's padding requests.
            size = case.size
            self.execute(zeros[:size], zeros[:size], None, uniform_decode=case.uniform_decode)

        return capture_graphs(
            run_case,
            plan,
            self.platform,
            runs_per_size=self.config.graph_warmups + 1,
            progress=progress,
        )

    def warm_up(self) -> None:
        """Compile the model now for the step sizes that run without graphs (any size
        above the captured ones, and each of the config's ``compile_sizes``), so that a
        server's first request does not wait for the compiler; ``capture`` compiles the
        captured sizes.  A no-op for a model that is not compiled."""
        if self.config is None:
            return
        # Above every capture size, and not 1: a first call of one token would
        # specialise the trace on it.
        general = max(self.capture_sizes, default=1) + 1
        sizes = [general, *self.config.compile_sizes]
        eager_sizes = sorted(
            {size for size in sizes if self.dispatcher.dispatch(size, False).mode == GraphMode.NONE}
        )
        logger.info("compiling for steps without graphs: dummy steps of %s tokens", eager_sizes)
        for size in eager_sizes:
            # Without metadata the attention op only zero-fills its output, as in capture.
            zeros = torch.zeros(size, dtype=torch.long, device=self.device)
            self.execute(zeros, zeros, None)  # token ids and positions

    # -- generation ----------------------------------------------------------------

    def add_requests(self, prompts: Sequence[Sequence[int]], max_new_tokens: int) -> list[Request]:
        """Reserve cache blocks for each prompt and its continuation, for all or none."""
        check_prompts(
            prompts, max_new_tokens, vocab_size=self.vocab_size, max_model_len=self.max_model_len
        )
        block_ids = self.allocator.allocate_all([len(p) + max_new_tokens for p in prompts])
        return [
            Request(tokens=list(prompt), block_ids=blocks)
            for prompt, blocks in zip(prompts, block_ids, strict=True)
        ]

    def free(self, sequences: Sequence[Request]) -> None:
        """Return the requests' cache blocks; they leave the persistent step inputs."""
        self.step_inputs.forget(sequences)
        for sequence in sequences:
            self.allocator.free(sequence.block_ids)

    def step(self, sequences: Sequence[Request]) -> torch.Tensor:
        """Run every sequence's uncached tokens; return the logits of each last token, in
        the order of ``sequences``.

        Backends read a batch as [decodes..., prefills...] (see AttentionMetadataBuilder);
        the step orders it so, whatever order callers keep their sequences in.  A request
        joins the persistent step inputs the first step it is in and leaves them when a
        step goes on without it or it is freed.
        """
        if not sequences:
            raise ValueError("step() got no sequences; an empty batch must not reach the model")
        query_lens = [len(s.tokens) - s.num_cached for s in sequences]
        uniform_decode = max(query_lens) == 1
        if uniform_decode:
            order, batch = None, sequences
        else:
            # Stable: decodes (one uncached token) first, each group in the caller's order.
            order = sorted(range(len(sequences)), key=lambda i: query_lens[i] > 1)
            batch = [sequences[i] for i in order]
            query_lens = [query_lens[i] for i in order]
        num_tokens = sum(query_lens)
        graphs = self._dispatch(num_tokens, uniform_decode)
        inputs = self.step_inputs
        buffers = inputs.buffers_for(graphs.padded_size)
        inputs.write(buffers, batch, query_lens, uniform_decode=uniform_decode)
        padded = graphs.padded_size
        as_built = graphs.metadata_layout == MetadataLayout.AS_BUILT
        if not as_built:  # the static layout's padding goes into the host arrays first
            metadata = self._static_step_metadata(graphs, buffers, len(batch), num_tokens)
        if padded > num_tokens:
            inputs.pad_inputs(buffers, num_tokens, padded)
        buffers.upload(padded, len(batch) if as_built else padded)
        if as_built:  # after the upload: metadata kept from a step before reads it
            metadata = self._step_metadata(graphs, buffers, batch, query_lens, num_tokens)
        recorded = self.recorded_steps.get(graphs) if self.recorded_steps else None
        if recorded is not None and self._still_valid(recorded):
            hidden = recorded.run(metadata)
        else:
            hidden = self._run(graphs, *buffers.model_inputs(padded), metadata)
            if uniform_decode and graphs.mode != GraphMode.NONE:
                self._record(graphs, hidden)
        for sequence in batch:
            sequence.num_cached = len(sequence.tokens)
        if uniform_decode:
            # Decode steps, the common case, skip the gathers: each request's last token is
            # its only row, in the caller's order.
            return self.model.compute_logits(
                hidden if padded == num_tokens else hidden[:num_tokens]
            )
        last_rows = buffers.metadata.query_start_loc[1 : len(batch) + 1].long() - 1
        logits = self.model.compute_logits(hidden[last_rows])
        assert order is not None
        if order == list(range(len(order))):
            return logits
        return logits[torch.tensor(order, device=logits.device).argsort()]

    def _still_valid(self, recorded: RecordedStep) -> bool:
        """Whether a recorded step still holds; a stale one is dropped (the step then
        runs normally and is recorded again)."""
        reason = recorded.stale()
        if reason is None:
            return True
        logger.debug(
            "recorded decode step of size %d dropped: %s", recorded.graphs.padded_size, reason
        )
        assert self.recorded_steps is not None
        del self.recorded_steps[recorded.graphs]
        return False

    def _record(self, graphs: StepGraphs, hidden: torch.Tensor) -> None:
        """Record the uniform decode step ``graphs`` that just returned ``hidden``, once
        all its graphs are captured and checked."""
        if self.recorded_steps is None:
            return
        try:
            self.recorded_steps[graphs] = record_step(self.model, graphs, hidden)
        except NotReady:
            pass
        except NotRecordable as err:
            logger.warning(
                "decode steps of %s run through the model's full call path every step, not "
                "as a recorded list of calls: %s",
                type(self.model).__name__,
                err,
            )
            self.recorded_steps = None

    def _step_metadata(
        self,
        graphs: StepGraphs,
        buffers: StepBuffers,
        batch: Sequence[Request],
        query_lens: Sequence[int],
        num_tokens: int,
    ) -> AttentionMetadata:
        """The step's metadata as written into ``buffers`` for ``batch`` (and uploaded):
        the one kept for steps of its shape, set to this step (``next_step``, which may
        recompute on the device what it derives from the values), or a new one."""
        num_reqs = len(batch)
        num_decodes = num_reqs if graphs.uniform_decode else query_lens.count(1)
        max_query_len = max(query_lens)
        max_seq_len = max(len(s.tokens) for s in batch)
        shape = (num_reqs, num_tokens, num_decodes)
        metadata = buffers.step_metadata(shape)
        if metadata is not None:
            next_step(metadata, max_query_len=max_query_len, max_seq_len=max_seq_len)
            return metadata
        metadata = self.metadata_builder.from_buffers(
            buffers.metadata_views(num_reqs, num_tokens),
            num_reqs=num_reqs,
            num_tokens=num_tokens,
            num_decodes=num_decodes,
            max_query_len=max_query_len,
            max_seq_len=max_seq_len,
        )
        if buffers is self.step_inputs.graph:
            buffers.keep_step_metadata(shape, metadata)
        return metadata

    def _static_step_metadata(
        self, graphs: StepGraphs, buffers: StepBuffers, num_reqs: int, num_tokens: int
    ) -> AttentionMetadata:
        """The step's metadata in the static layout a FULL graph reads: the padding
        requests written into ``buffers``' host arrays after the ``num_reqs`` real ones."""
        static = self.static_metadata
        assert static is not None
        padded = graphs.padded_size
        # Padding requests take the rows after the real ones, on the scratch block.
        buffers.forget_rows(range(num_reqs, padded))
        if graphs.metadata_layout == MetadataLayout.UNIFORM_DECODE:
            return static.pad_uniform_decode(
                padded, num_reqs, buffers.host_metadata, self.step_inputs.arange
            )
        buffers.decode_starts = 0  # the general layout's query starts are its own
        return static.pad_general(
            padded, num_reqs, num_tokens, buffers.host_metadata, self.step_inputs.arange
        )


def check_prompts(
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    *,
    vocab_size: int | None,
    max_model_len: int,
) -> None:
    """Refuse a batch the model cannot run before it takes cache blocks or reaches the
    model: there, an out-of-vocabulary id aborts the process under Inductor (and passes
    silently under tensor parallelism), and an empty input breaks compilation."""
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens is {max_new_tokens}; ask for at least 1 token")
    if not prompts:
        raise ValueError("no prompts to generate from; pass at least one list of token ids")
    for index, prompt in enumerate(prompts):
        if not prompt:
            raise ValueError(f"prompt {index} is empty; give it at least one token id")
        if vocab_size is not None:
            for token in prompt:
                if not 0 <= token < vocab_size:
                    raise ValueError(
                        f"prompt {index} has token id {token}, outside the vocabulary of "
                        f"{vocab_size}; use ids from 0 to {vocab_size - 1}"
                    )
        if len(prompt) + max_new_tokens > max_model_len:
            raise ValueError(
                f"prompt {index} has {len(prompt)} tokens and asks for {max_new_tokens} "
                f"more, over max_model_len {max_model_len}; shorten it or ask for fewer tokens"
            )


def compiled_config(model: torch.nn.Module) -> CompilationConfig | None:
    """The platform-adjusted config of the first compiled module in ``model``, if any."""
    for module in model.modules():
        compiled = compiled_forward_of(module)
        if compiled is not None:
            return compiled.config
    return None
