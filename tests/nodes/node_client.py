"""The trainer and engine processes of one node of the test bed: reads one JSON command
per line on stdin, answers one JSON line on stdout ({"ok": ...} or {"error": "..."}).

    {"op": "zero3", "agents": {"0": SOCKET, ...}, "dp": 4, "seed": 1}
        ZeRO-3 trainer ranks (the DeepSpeed stand-in), DP rank r on agent r's socket
    {"op": "masters", "agents": {...}, "dp": 4, "seed": 1}
        ZeRO-1/2 trainer ranks registering their fp32 master partitions
    {"op": "engines", "agents": {"4": SOCKET, ...}, "tp": 2, "first": 4}
        vLLM stand-in engine ranks, agent r holding TP rank (r - first) % tp, poisoned
    {"op": "refill", "seed": 2}        new values into every trainer rank, in place
    {"op": "reregister"}               every registration again (after its agent restarted)
    {"op": "check", "kind": "zero3", "seed": 2, "ranks": [4, 5]}
        engine parameters unlike the oracle's for that trainer kind's values of that seed,
        on the engines of those agents (default all)
    {"op": "exit"}
"""

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))

import torch  # noqa: E402

from model_oracle import CheckpointModule, differences, loaded_engine, random_checkpoint, random_masters  # noqa: E402
from shardsync.client import AgentClient  # noqa: E402
from shardsync.integrations import EngineTarget, TrainerSource, loader_targets, zero3_sources  # noqa: E402
from shardsync.integrations import zero12_master_sources  # noqa: E402
from standins import deepspeed_zero, vllm_qwen3  # noqa: E402

# A decoder of about 4 M bfloat16 elements: large enough that payload dominates the links.
CONFIG = vllm_qwen3.Qwen3Config(vocab_size=2048, hidden_size=256, intermediate_size=768, num_hidden_layers=2,
                                num_attention_heads=8, num_key_value_heads=4, head_dim=32)
SHAPES = vllm_qwen3.checkpoint_shapes(CONFIG)


class Node:
    def __init__(self):
        self.trainers = []  # (kind, module, optimizer or None, dp rank, dp)
        self.engines = []   # (engine, tp rank, tp, agent rank)
        self.handles = []

    def values(self, kind, seed):
        return random_masters(SHAPES, seed) if kind == "masters" else random_checkpoint(SHAPES, seed)

    def zero3(self, agents, dp, seed):
        checkpoint = self.values("zero3", seed)
        for rank, socket in agents.items():
            module = CheckpointModule(SHAPES)
            deepspeed_zero.partition_zero3(module, int(rank), dp, checkpoint)
            self.trainers.append(("zero3", module, None, int(rank), dp))
            self.handles.append(TrainerSource(AgentClient(socket), f"trainer-{rank}",
                                              lambda m=module: zero3_sources(m, rank_of=lambda g: g.rank,
                                                                               world_of=lambda g: g.world)))

    def masters(self, agents, dp, seed):
        masters = self.values("masters", seed)
        for rank, socket in agents.items():
            module = CheckpointModule(SHAPES)
            optimizer = deepspeed_zero.Zero12Optimizer(module, int(rank), dp, masters, round_robin=True)
            self.trainers.append(("masters", module, optimizer, int(rank), dp))
            self.handles.append(TrainerSource(
                AgentClient(socket), f"trainer-{rank}",
                lambda o=optimizer, m=module: zero12_master_sources(o, m, rank_of=lambda g: g.rank)))

    def engines_(self, agents, tp, first):
        for rank, socket in agents.items():
            tp_rank = (int(rank) - first) % tp
            engine = vllm_qwen3.Qwen3ForCausalLM(CONFIG, tp_rank=tp_rank, tp_size=tp)
            for param in engine.parameters():
                param.data.fill_(float("nan"))
            self.engines.append((engine, tp_rank, tp, int(rank)))
            self.handles.append(EngineTarget(AgentClient(socket), f"rollout-{rank}",
                                             lambda e=engine: loader_targets(e, e.load_weights, SHAPES)))

    def refill(self, seed):
        for kind, module, optimizer, rank, dp in self.trainers:
            values = self.values(kind, seed)
            if kind == "zero3":
                deepspeed_zero.refill_zero3(module, values)
            else:
                fresh = deepspeed_zero.Zero12Optimizer(CheckpointModule(SHAPES), rank, dp, values, round_robin=True)
                for mine, theirs in zip(optimizer.single_partition_of_fp32_groups,
                                        fresh.single_partition_of_fp32_groups):
                    mine.copy_(theirs)

    def check(self, kind, seed, ranks=None):
        values = self.values(kind, seed)
        expected = {name: value.to(torch.bfloat16) for name, value in values.items()}
        return [f"rank {rank}: {name}" for engine, tp_rank, tp, rank in self.engines if ranks is None or rank in ranks
                for name in differences(engine, loaded_engine(CONFIG, tp_rank, tp, expected))]


def main():
    node = Node()
    for line in sys.stdin:
        command = json.loads(line)
        op = command.pop("op")
        try:
            if op == "exit":
                break
            elif op == "zero3":
                result = node.zero3(**command)
            elif op == "masters":
                result = node.masters(**command)
            elif op == "engines":
                result = node.engines_(**command)
            elif op == "refill":
                result = node.refill(**command)
            elif op == "reregister":
                result = [handle.reregister() for handle in node.handles]
            elif op == "check":
                result = node.check(**command)
            else:
                raise ValueError(f"unknown op {op!r}")
            print(json.dumps({"ok": result if result is not None else True}), flush=True)
        except Exception as error:  # the test reads why
            print(json.dumps({"error": f"{type(error).__name__}: {error}"}), flush=True)
    for handle in node.handles:
        handle.close()


if __name__ == "__main__":
    main()
