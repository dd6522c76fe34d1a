"""``LLMEngine``: many requests through one ``ModelRunner``, a step at a time.

Requests join (``add_request``) and leave (``abort``) between any two steps.  Each
``step`` asks the ``Scheduler`` for a batch (decodes first, then prompt chunks, within
a token budget), runs it, samples a token for every request whose tokens are all
computed (each with its own parameters and, seeded, its own generator), detokenizes
it, checks the request's stopping rules and returns what changed.  Finished and
aborted requests give their cache blocks back at once.

Under tensor parallelism every rank runs its own engine over its shard: all ranks
must add and abort the same requests in the same order and call ``step`` together,
and sampled requests need a seed.  The scheduler's decisions depend on nothing else,
so the ranks' batches, and their collectives, stay in lock-step.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from slotwise_engine.runner.model_runner import ModelRunner
from slotwise_engine.runner.sampling import Sampler, seeded_generator
from slotwise_engine.serving.detokenizer import Detokenizer
from slotwise_engine.serving.engine_request import EngineRequest
from slotwise_engine.serving.errors import RequestError
from slotwise_engine.serving.non_finite_logits import non_finite_logits_error, to_host
from slotwise_engine.serving.outputs import RequestOutput
from slotwise_engine.serving.request_params import RequestParams
from slotwise_engine.serving.scheduler import ScheduledStep, Scheduler

if TYPE_CHECKING:
    from slotwise.compilation.config import CompilationConfig
    from slotwise_engine.models.tokenizer import Tokenizer

#: The cache ``from_checkpoint`` allocates unless told: 16384 tokens in blocks of 16.
DEFAULT_KV_BLOCKS = 1024


#: The kinds of step ``StepTotals`` counts apart: every request computes the one token
#: it sampled last ("decode": the steps a memory roofline bounds), or some compute prompt
#: chunks ("mixed").
STEP_KINDS = ("decode", "mixed")


@dataclass
class StepTotals:
    """What the engine's steps of one kind did since it started: a benchmark reads the
    difference over a run to see how large the batches were and how long a step took."""

    steps: int = 0
    #: Wall time in ``LLMEngine.step``: scheduling, the model, sampling, detokenizing.
    seconds: float = 0.0
    #: Requests in those steps, summed over the steps.
    requests: int = 0
    #: Tokens whose keys and values those steps' requests attend to (each request's
    #: context, the new tokens included), summed over the requests and steps.
    context_tokens: int = 0


@dataclass
class EngineStats:
    """How busy the engine is, between steps."""

    num_running: int
    num_waiting: int
    kv_blocks_used: int
    kv_blocks_total: int
    num_preemptions: int
    #: ``StepTotals`` by kind (``STEP_KINDS``).
    step_totals: dict[str, StepTotals] = field(default_factory=dict)


class LLMEngine:
    """Serves requests over ``runner``, which it owns from here: its cache blocks are
    the scheduler's.

    ``tokenizer``: for text prompts, output text and stop strings (without one, prompts
    are token ids and the text stays empty).  ``eos_token_ids``: where requests stop
    unless they ``ignore_eos``.  ``max_num_seqs`` and ``max_num_batched_tokens`` bound
    each step's requests and tokens.  ``checkpoint``: where the model came from, for
    errors to name.
    """

    def __init__(
        self,
        runner: ModelRunner,
        *,
        tokenizer: Tokenizer | None = None,
        eos_token_ids: Collection[int] = (),
        max_num_seqs: int = 64,
        max_num_batched_tokens: int = 512,
        model_name: str = "",
        checkpoint: str | os.PathLike[str] | None = None,
    ) -> None:
        self.runner = runner
        self.tokenizer = tokenizer
        self.eos_token_ids = frozenset(eos_token_ids)
        self.model_name = model_name
        self.checkpoint = checkpoint
        self.scheduler = Scheduler(
            runner, max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens
        )
        #: The most tokens (prompt and output) of one request: the model's limit, or what
        #: the whole cache holds if less.
        self.max_model_len = min(
            runner.max_model_len, self.scheduler.num_blocks * self.scheduler.block_size
        )
        self._requests: dict[str, EngineRequest] = {}  # the unfinished ones
        self._aborted: list[RequestOutput] = []  # outputs the next step returns
        self._sampled: list[EngineRequest] = []  # the rows of ``_sampler``
        self._sampler: Sampler | None = None
        self._step_totals = {kind: StepTotals() for kind in STEP_KINDS}

    @classmethod
    def from_checkpoint(
        cls,
        model_dir: str | os.PathLike[str],
        *,
        max_num_seqs: int = 64,
        max_num_batched_tokens: int = 512,
        num_kv_blocks: int | None = None,
        compilation: CompilationConfig | None = None,
        dtype: str | torch.dtype | None = None,
        max_model_len: int | None = None,
        model_name: str | None = None,
    ) -> LLMEngine:
        """An engine for the Hugging Face checkpoint folder ``model_dir`` (weights and
        tokenizer), compiled and with its graphs captured before it takes a request.
        ``num_kv_blocks``: the cache's blocks (default ``DEFAULT_KV_BLOCKS``);
        ``compilation``: as ``load_model``'s ``compilation_config`` (None: the default
        levels); ``model_name``: default the folder's name."""
        from slotwise_engine.models import load_model
        from slotwise_engine.models.tokenizer import Tokenizer

        folder = Path(model_dir)
        tokenizer = Tokenizer.load(folder)  # before the model: a tokenizer error costs nothing
        model = load_model(
            folder, dtype=dtype, compilation_config=compilation, max_model_len=max_model_len
        )
        runner = ModelRunner(
            model, num_blocks=num_kv_blocks or DEFAULT_KV_BLOCKS, max_model_len=max_model_len
        )
        runner.warm_up()
        runner.capture(progress=False)
        return cls(
            runner,
            tokenizer=tokenizer,
            eos_token_ids=tokenizer.eos_token_ids or model.config.eos_token_ids,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            model_name=folder.name if model_name is None else model_name,
            checkpoint=folder,
        )

    # -- requests ------------------------------------------------------------------

    def add_request(
        self, request_id: str, prompt: str | Sequence[int], params: RequestParams
    ) -> None:
        """Queue a request; ``prompt`` is text (encoded with the tokenizer) or token ids.
        Raises ``RequestError`` for a request the engine cannot run, before it takes
        anything."""
        self.enqueue(self.make_request(request_id, prompt, params))

    def make_request(
        self, request_id: str, prompt: str | Sequence[int], params: RequestParams
    ) -> EngineRequest:
        """The checked request, not queued yet (``enqueue``); changes nothing."""
        if not isinstance(request_id, str):
            raise RequestError(f"request id {request_id!r} is not a string")
        if request_id in self._requests:
            raise RequestError(f"request id {request_id!r} is in use; give each request its own")
        if not isinstance(params, RequestParams):
            raise RequestError(f"params is {params!r}; pass a RequestParams")
        if params.stop and self.tokenizer is None:
            raise RequestError(
                "stop strings need the engine's tokenizer to read the text; pass "
                "LLMEngine(tokenizer=...) or stop at token ids (stop_token_ids)"
            )
        token_ids = self._prompt_ids(prompt)
        total = len(token_ids) + params.max_tokens
        if total > self.max_model_len:
            limit = (
                f"max_model_len {self.max_model_len}"
                if self.max_model_len == self.runner.max_model_len
                else f"the {self.max_model_len} tokens the whole KV cache holds "
                "(raise num_kv_blocks)"
            )
            raise RequestError(
                f"the prompt has {len(token_ids)} tokens and asks for {params.max_tokens} more "
                f"(max_tokens), over {limit}; shorten the prompt or ask for fewer tokens"
            )
        assert self.scheduler.fits(total)
        return EngineRequest(
            request_id=request_id,
            prompt_token_ids=token_ids,
            params=params,
            arrival_time=time.monotonic(),
            detokenizer=Detokenizer(self.tokenizer, params.stop),
            generator=seeded_generator(params.sampling, self.runner.device),
        )

    def enqueue(self, request: EngineRequest) -> None:
        """Queue a request ``make_request`` made."""
        if request.request_id in self._requests:
            raise RequestError(
                f"request id {request.request_id!r} is in use; give each request its own"
            )
        self._requests[request.request_id] = request
        self.scheduler.add(request)

    def _prompt_ids(self, prompt: str | Sequence[int]) -> list[int]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise RequestError(
                    "the prompt is text, but the engine has no tokenizer; pass token ids or "
                    "LLMEngine(tokenizer=...)"
                )
            token_ids = self.tokenizer.encode(prompt)
        else:
            token_ids = list(prompt)
            for position, token in enumerate(token_ids):
                if not isinstance(token, int) or isinstance(token, bool):
                    raise RequestError(
                        f"the prompt has {token!r} at position {position}; token ids are ints"
                    )
        if not token_ids:
            raise RequestError("the prompt is empty; give it at least one token")
        vocab_size = self.runner.vocab_size
        if vocab_size is not None:
            for token in token_ids:
                if not 0 <= token < vocab_size:
                    raise RequestError(
                        f"the prompt has token id {token}, outside the vocabulary of "
                        f"{vocab_size}; use ids from 0 to {vocab_size - 1}"
                    )
        return token_ids

    def abort(self, request_id: str) -> None:
        """End a request now; its blocks go back at once, and the next ``step`` returns
        its last output (finish reason "abort").  An unknown or finished id: no-op."""
        request = self._requests.pop(request_id, None)
        if request is None:
            return
        self.scheduler.remove(request)
        request.finish_reason = "abort"
        request.finished_time = time.monotonic()
        self._aborted.append(self._output(request, [], ""))

    def has_unfinished(self) -> bool:
        """Whether a ``step`` has anything to do or report."""
        return bool(self._requests or self._aborted)

    def stats(self) -> EngineStats:
        scheduler = self.scheduler
        return EngineStats(
            num_running=len(scheduler.running),
            num_waiting=len(scheduler.waiting),
            kv_blocks_used=scheduler.num_blocks_used,
            kv_blocks_total=scheduler.num_blocks,
            num_preemptions=scheduler.num_preemptions,
            step_totals={kind: dataclasses.replace(t) for kind, t in self._step_totals.items()},
        )

    # -- steps ---------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        """Run one step; the outputs of the requests that got a token, finished or were
        aborted since the last one.

        Raises ``NonFiniteLogitsError`` when the logits a token is drawn from hold NaN or
        +inf, or only -inf.  Any error aborts every request (their blocks go back)
        before it propagates: a failed step leaves no request half-computed.
        """
        outputs, self._aborted = self._aborted, []
        try:
            with torch.inference_mode():  # a serving step never needs autograd
                return outputs + self._step()
        except BaseException:
            self._abort_all()
            raise

    def _step(self) -> list[RequestOutput]:
        """One scheduled batch through the runner; the outputs of its sampled requests."""
        start = time.perf_counter()
        scheduled = self.scheduler.schedule()
        if not scheduled.requests:
            return []
        decode = all(
            n == 1 and r.num_output_tokens > 0
            for r, n in zip(scheduled.requests, scheduled.num_tokens, strict=True)
        )
        try:
            return self._run_scheduled(scheduled)
        finally:
            totals = self._step_totals["decode" if decode else "mixed"]
            totals.steps += 1
            totals.seconds += time.perf_counter() - start
            totals.requests += len(scheduled.requests)
            totals.context_tokens += sum(r.runner_request.num_cached for r in scheduled.requests)

    def _run_scheduled(self, scheduled: ScheduledStep) -> list[RequestOutput]:
        """The model, sampling and the stopping rules for the batch ``scheduled``."""
        logits = self.runner.step([r.runner_request for r in scheduled.requests])
        rows = [row for row, sample in enumerate(scheduled.samples) if sample]
        if not rows:
            return []
        sampled = [scheduled.requests[row] for row in rows]
        if len(rows) < len(scheduled.requests):
            logits = logits[rows]
        tokens, maxima = to_host(*self._sample(logits, sampled))
        if not all(map(math.isfinite, maxima)):
            bad = [r for r, m in zip(sampled, maxima, strict=True) if not math.isfinite(m)]
            raise non_finite_logits_error(
                self.runner.model,
                self.checkpoint,
                position=bad[0].num_output_tokens + 1,
                names=[r.request_id for r in bad],
            )
        now = time.monotonic()
        return [
            self._append(request, token, now)
            for request, token in zip(sampled, tokens, strict=True)
        ]

    def _sample(
        self, logits: torch.Tensor, requests: list[EngineRequest]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Each row's token and largest logit; greedy batches take the argmax alone, and
        a batch of other requests than the last one's gets a sampler of its own."""
        if all(r.params.temperature == 0 for r in requests):
            top, tokens = logits.max(-1)
            return tokens, top
        same = len(requests) == len(self._sampled) and all(
            a is b for a, b in zip(requests, self._sampled, strict=True)
        )
        if not same or self._sampler is None:
            self._sampler = Sampler(
                [r.params.sampling for r in requests],
                self.runner.device,
                generators=[r.generator for r in requests],
            )
            self._sampled = requests
        return self._sampler.sample(logits)

    def _append(self, request: EngineRequest, token: int, now: float) -> RequestOutput:
        """Give ``request`` its new ``token``; finish it if a stopping rule says so."""
        request.token_ids.append(token)
        if request.first_token_time is None:
            request.first_token_time = now
        params = request.params
        detokenizer = request.detokenizer
        reason = None
        if token in params.stop_token_ids or (
            not params.ignore_eos and token in self.eos_token_ids
        ):
            reason = "stop"  # the stop token's text is not part of the output
        elif detokenizer.push(token):
            reason = "stop"
        elif request.num_output_tokens >= params.max_tokens:
            reason = "length"
        if reason is not None:
            detokenizer.finish()
            if detokenizer.stopped:
                reason = "stop"
            self._finish(request, reason, now)
        return self._output(request, [token], detokenizer.take_new(final=reason is not None))

    def _finish(self, request: EngineRequest, reason: str, now: float) -> None:
        request.finish_reason = reason
        request.finished_time = now
        del self._requests[request.request_id]
        self.scheduler.remove(request)

    def _abort_all(self) -> None:
        for request_id in list(self._requests):
            self.abort(request_id)
        self._aborted = []
        self._sampled, self._sampler = [], None

    def _output(
        self, request: EngineRequest, new_token_ids: list[int], new_text: str
    ) -> RequestOutput:
        return RequestOutput(
            request_id=request.request_id,
            prompt_token_ids=request.prompt_token_ids,
            new_token_ids=new_token_ids,
            token_ids=request.output_token_ids,
            new_text=new_text,
            text=request.detokenizer.released_text,
            finished=request.finish_reason is not None,
            finish_reason=request.finish_reason,
            arrival_time=request.arrival_time,
            first_token_time=request.first_token_time,
            finished_time=request.finished_time,
        )
