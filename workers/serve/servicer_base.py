"""What every engine's ``Worker`` servicer shares, whatever engine serves the verbs (ours:
:mod:`workers.serve.servicer`; vLLM's: ``vllm_backend.servicer``): the role and its drain
(:mod:`workers.serve.role_switch`), the checks of a call before the engine sees it
(:mod:`workers.serve.rpc_edge`), the sampling fields turned into the engine's params
(:func:`workers.serve.wire.sampling_params`), and ``SetRole``.

A subclass implements the engine's verbs and :meth:`ServicerBase._busy` (whether the
engine holds any work: what a drain waits out).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc

from proto import worker_pb2 as pb
from proto import worker_pb2_grpc
from proto.records import ROLES
from workers.core.sequence import SamplingParams
from workers.serve.role_switch import RoleSwitch
from workers.serve.rpc_edge import Request, lease_error, request_error
from workers.serve.wire import sampling_params

Context = grpc.aio.ServicerContext[Any, Any]


class ServicerBase(worker_pb2_grpc.WorkerServicer):
    """``role`` (changeable by ``SetRole``), the model length calls are checked against,
    and whether the engine joined the pool (the ``prefill`` and ``decode`` roles need it).
    ``on_change`` is called (on a thread) after the role or the drain state changed."""

    def __init__(
        self, role: str, on_change: Callable[[], None], max_model_len: int, pool_attached: bool
    ) -> None:
        self.roles = RoleSwitch(role, on_change)
        """Role and drain (:mod:`workers.serve.role_switch`)."""
        self.max_model_len = max_model_len
        self.pool_attached = pool_attached

    @property
    def role(self) -> str:
        return self.roles.role

    @property
    def draining(self) -> bool:
        return self.roles.draining

    @property
    def on_change(self) -> Callable[[], None]:
        """Called (on a thread) after the role or the drain state changed (re-publishes the
        record)."""
        return self.roles.on_change

    @on_change.setter
    def on_change(self, callback: Callable[[], None]) -> None:
        self.roles.on_change = callback

    async def _admit(self, verb: str, context: Context, held: bool = False) -> None:
        """Abort the call unless this role takes ``verb`` and the worker is not draining
        (``held``: the call finishes work the worker already holds, taken even so)."""
        if refusal := self.roles.refusal(verb, held):
            await context.abort(*refusal)

    async def _check(self, request: Request, context: Context) -> None:
        """Abort the call with INVALID_ARGUMENT unless its request id is well-formed and its
        token lists and cache salt fit this worker
        (:func:`workers.serve.rpc_edge.request_error`)."""
        if error := request_error(request, self.max_model_len):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, error)

    async def _check_lease(self, request: pb.ReserveRequest, context: Context) -> None:
        """Abort a ``Reserve`` whose lease is over the limit (INVALID_ARGUMENT)."""
        if error := lease_error(request.lease_ms):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, error)

    async def _params(self, msg: pb.SamplingParams, context: Context) -> SamplingParams:
        """The engine's params, or the call aborted with INVALID_ARGUMENT."""
        try:
            return sampling_params(msg)
        except ValueError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            raise  # (abort raises; for the type checker)

    async def SetRole(self, request: pb.SetRoleRequest, context: Context) -> pb.SetRoleReply:
        if request.role not in ROLES:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"role must be one of {ROLES}")
        if request.role != "mixed" and not self.pool_attached:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION, f"role {request.role} needs the KV pool"
            )
        previous = await self.roles.change(request.role, self._busy)
        return pb.SetRoleReply(role=self.role, previous=previous)

    async def _busy(self) -> bool:
        """Whether the engine holds any work (what a drain waits out)."""
        raise NotImplementedError
