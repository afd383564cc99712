"""shardsync for Python: register trainer and rollout buffers with the local agent,
trigger syncs and read status from the coordinator.

Uses grpcio and protobuf; the message modules (layout_pb2, shardsync_pb2,
shardsync_pb2_grpc) are generated into this package, importing each other
package-relatively: by ``scripts/build-wheel`` for the wheel, by
``bazel build //client/python:shardsync`` in the development tree.
"""

from shardsync import layout_pb2, shardsync_pb2, shardsync_pb2_grpc
from shardsync.client import (
    AgentClient,
    CoordinatorClient,
    DescriptorBuffer,
    Registration,
    ShardsyncError,
)
from shardsync.layouts import (
    DTYPE_BYTES,
    SharedBuffer,
    WeightArena,
    flat_partition,
    tensor_layout,
    tp_shard_box,
    zero3_partition,
)

__all__ = [
    "AgentClient",
    "CoordinatorClient",
    "DTYPE_BYTES",
    "DescriptorBuffer",
    "Registration",
    "SharedBuffer",
    "ShardsyncError",
    "WeightArena",
    "flat_partition",
    "layout_pb2",
    "shardsync_pb2",
    "shardsync_pb2_grpc",
    "tensor_layout",
    "tp_shard_box",
    "zero3_partition",
]
