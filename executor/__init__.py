"""Executor layer: out-of-order engine, receive arbiter, backends, communicators, executor thread.

Imports only ``scheduler.instruction_graph`` and ``scheduler.geometry`` from the
scheduler; never ``celeritas``.
"""
from .communicator import (Communicator, CommunicatorError, InProcessCluster, InProcessCommunicator,
                           Request, SingleRankCommunicator)
from .executor import Executor, ExecutorStopped
from .tracing import TraceEvent
from .out_of_order_engine import Assignment, OutOfOrderEngine, Target
from .receive_arbiter import ReceiveArbiter

__all__ = ["Communicator", "CommunicatorError", "InProcessCluster", "InProcessCommunicator", "Request",
           "SingleRankCommunicator", "Executor", "ExecutorStopped", "TraceEvent", "Assignment",
           "OutOfOrderEngine", "Target", "ReceiveArbiter"]
