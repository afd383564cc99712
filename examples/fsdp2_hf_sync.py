"""An FSDP2 trainer and a Hugging Face rollout model on one GPU, synced through real
shardsync daemons: what a user writes is the lines marked "user". Run on a GPU machine,
after scripts/build-portable:

    PYTHONPATH=dist/python python3 examples/fsdp2_hf_sync.py dist/bin

A small Qwen3 config with random weights (no download). Prints the sync's stats and
whether the rollout's weights equal the trainer's, byte for byte.
"""

import os
import sys
import tempfile

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from transformers import Qwen3Config, Qwen3ForCausalLM

from shardsync.client import AgentClient, CoordinatorClient
from shardsync.integrations import EngineTarget, TrainerSource, fsdp2_sources, module_targets
from shardsync.testing import LocalCluster

config = Qwen3Config(vocab_size=1024, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                     num_attention_heads=8, num_key_value_heads=4, head_dim=32, tie_word_embeddings=False)
cluster = LocalCluster(sys.argv[1], 1, tempfile.mkdtemp(prefix="ss-example-"), cuda=True)  # one agent, GPU 0
dist.init_process_group("nccl", rank=0, world_size=1, init_method=f"tcp://127.0.0.1:{29400 + os.getpid() % 500}")
torch.cuda.set_device(0)
try:
    trainer = Qwen3ForCausalLM(config).to(torch.bfloat16).cuda()
    for layer in trainer.model.layers:
        fully_shard(layer, mesh=init_device_mesh("cuda", (1,)))
    fully_shard(trainer, mesh=init_device_mesh("cuda", (1,)))
    rollout = Qwen3ForCausalLM(config).to(torch.bfloat16).cuda()

    agent = AgentClient(cluster.socket(0))                                             # user
    source = TrainerSource(agent, "trainer-0", lambda: fsdp2_sources(trainer))         # user
    target = EngineTarget(agent, "rollout-0", lambda: module_targets(rollout))         # user
    coordinator = CoordinatorClient(cluster.coordinator, insecure=True)                # user

    torch.cuda.synchronize()  # the trainer's writes are complete                       # user
    target.pause()                                                                     # user
    stats = coordinator.sync(timeout=60, verify=True)                                  # user
    target.resume(stats.sync_id)                                                       # user

    full = {name: p.full_tensor() for name, p in trainer.named_parameters()}
    same = all(torch.equal(p.view(torch.int16), full[n].view(torch.int16)) for n, p in rollout.named_parameters())
    print(f"synced {sum(r.received_bytes + r.local_bytes for r in stats.ranks)} bytes in "
          f"{max(r.seconds for r in stats.ranks) * 1e3:.2f} ms; rollout equals trainer: {same}")
    source.close()
    target.close()
    sys.exit(0 if same else 1)
finally:
    dist.destroy_process_group()
    cluster.stop()
