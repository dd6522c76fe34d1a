"""``Scheduler``: which requests run in the next step, and how many of their tokens.

First come, first served, with continuous batching over a paged KV cache:

- Each step takes the running requests' decodes first (one token each), then chunks
  of the prompts being prefilled, then admits waiting requests in arrival order, all
  within ``max_num_batched_tokens`` tokens and ``max_num_seqs`` running requests.  A
  prompt longer than what is left of the budget is prefilled a chunk per step, beside
  the decodes of the others.
- Cache blocks are taken as a request grows, not reserved up front.  When a running
  request needs a block and none is free, the request admitted last is preempted: its
  blocks go back, and it waits at the front of the queue to be computed again (prompt
  and tokens so far) once blocks are free.  A request is admitted only when its first
  chunk fits, and no request is accepted that the whole cache could not hold alone, so
  the oldest running request always makes progress: nothing deadlocks.
- A finished or aborted request's blocks go back at once.

Every decision depends only on the requests added, their lengths and the order of
calls, never on time or randomness: tensor-parallel ranks that add the same requests
in the same order run the same steps (lock-step).
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from slotwise.attention import num_blocks_for
from slotwise_engine.runner.model_runner import Request
from slotwise_engine.serving.errors import SchedulerStalledError

if TYPE_CHECKING:
    from slotwise_engine.runner.model_runner import ModelRunner
    from slotwise_engine.serving.engine_request import EngineRequest


@dataclass
class ScheduledStep:
    """One step's batch: each request and how many of its tokens it computes, decodes
    first; the requests preempted to make room."""

    requests: list[EngineRequest] = field(default_factory=list)
    num_tokens: list[int] = field(default_factory=list)
    #: Whether each request gets a token from the step: its chunk reaches the end of the
    #: tokens it holds (a prompt's earlier chunks give none).
    samples: list[bool] = field(default_factory=list)
    preempted: list[EngineRequest] = field(default_factory=list)

    @property
    def total_tokens(self) -> int:
        return sum(self.num_tokens)


class Scheduler:
    """Schedules requests over ``runner``'s block allocator (``runner.free`` returns
    blocks and drops a request from the runner's persistent step inputs)."""

    def __init__(
        self, runner: ModelRunner, *, max_num_seqs: int, max_num_batched_tokens: int
    ) -> None:
        if max_num_seqs < 1:
            raise ValueError(f"max_num_seqs is {max_num_seqs}; run at least 1 request a step")
        if max_num_batched_tokens < 1:
            raise ValueError(
                f"max_num_batched_tokens is {max_num_batched_tokens}; allow at least 1 token a step"
            )
        self.runner = runner
        self.allocator = runner.allocator
        self.block_size = self.allocator.block_size
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        #: The blocks requests may take: those free when the scheduler starts.
        self.num_blocks = self.allocator.num_free_blocks
        self.waiting: collections.deque[EngineRequest] = collections.deque()
        #: In the order of admission: the last one is preempted first.
        self.running: list[EngineRequest] = []
        self.num_preemptions = 0

    @property
    def num_blocks_used(self) -> int:
        return self.num_blocks - self.allocator.num_free_blocks

    def fits(self, num_tokens: int) -> bool:
        """Whether a request of ``num_tokens`` tokens fits the cache alone."""
        return num_blocks_for(num_tokens, self.block_size) <= self.num_blocks

    def add(self, request: EngineRequest) -> None:
        self.waiting.append(request)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def remove(self, request: EngineRequest) -> None:
        """``request`` finished or was aborted: it leaves, its blocks go back now."""
        if request in self.running:
            self.running.remove(request)
            self._free(request)
        elif request in self.waiting:
            self.waiting.remove(request)

    def schedule(self) -> ScheduledStep:
        """The next step's batch; empty when nothing is waiting or running."""
        step = ScheduledStep()
        scheduled: dict[EngineRequest, int] = {}
        budget = self.max_num_batched_tokens
        decodes = [r for r in self.running if r.num_uncomputed == 1]
        prefills = [r for r in self.running if r.num_uncomputed > 1]
        for request in decodes + prefills:
            if budget == 0:
                break
            if request not in self.running:  # preempted for an earlier one
                continue
            num_tokens = min(request.num_uncomputed, budget)
            for victim in self._grow(request, num_tokens):
                step.preempted.append(victim)
                budget += scheduled.pop(victim, 0)
            if request in self.running:
                scheduled[request] = num_tokens
                budget -= num_tokens
        # Requests preempted in this step are owed their blocks first.
        if not step.preempted or not scheduled:
            budget -= self._admit(scheduled, budget)
        for request, num_tokens in scheduled.items():
            runner_request = request.runner_request
            end = runner_request.num_cached + num_tokens
            runner_request.tokens.extend(request.token_ids[len(runner_request.tokens) : end])
            step.requests.append(request)
            step.num_tokens.append(num_tokens)
            step.samples.append(end == len(request.token_ids))
        if not scheduled and self.has_unfinished():
            raise SchedulerStalledError(
                f"{len(self.waiting)} requests wait but none fits the "
                f"{self.allocator.num_free_blocks} free cache blocks (of {self.num_blocks} "
                "the scheduler started with): something else holds the runner's blocks; "
                "give the engine a runner of its own"
            )
        return step

    def _grow(self, request: EngineRequest, num_tokens: int) -> list[EngineRequest]:
        """Give ``request`` the blocks for ``num_tokens`` more tokens, preempting the
        requests admitted last until they fit; the requests preempted, ``request`` itself
        last if it was the last admitted."""
        runner_request = request.runner_request
        total = runner_request.num_cached + num_tokens
        preempted = []
        while True:
            missing = num_blocks_for(total, self.block_size) - len(runner_request.block_ids)
            if missing <= self.allocator.num_free_blocks:
                self.allocator.allocate(total, runner_request.block_ids)
                return preempted
            victim = self.running[-1]
            self._preempt(victim)
            preempted.append(victim)
            if victim is request:
                return preempted

    def _admit(self, scheduled: dict[EngineRequest, int], budget: int) -> int:
        """Admit waiting requests in arrival order while their first chunk fits; the
        tokens they take."""
        taken = 0
        while self.waiting and len(self.running) < self.max_num_seqs and taken < budget:
            request = self.waiting[0]
            num_tokens = min(request.num_uncomputed, budget - taken)
            if num_blocks_for(num_tokens, self.block_size) > self.allocator.num_free_blocks:
                break  # first come, first served: nobody overtakes it
            self.allocator.allocate(num_tokens, request.runner_request.block_ids)
            self.waiting.popleft()
            self.running.append(request)
            scheduled[request] = num_tokens
            taken += num_tokens
        return taken

    def _preempt(self, request: EngineRequest) -> None:
        """Free ``request``'s blocks; it waits first in line, to be computed again."""
        self.running.remove(request)
        self._free(request)
        request.runner_request = Request(tokens=[], block_ids=[])
        self.waiting.appendleft(request)
        self.num_preemptions += 1

    def _free(self, request: EngineRequest) -> None:
        self.runner.free([request.runner_request])
        request.runner_request.block_ids = []
