"""Delta sync under a real optimizer: torch's AdamW trains a small decoder-shaped model
(fp32 masters; the bfloat16 weights the trainer publishes are the masters rounded after
each step, as mixed-precision trainers keep them). Per step: the fraction of bfloat16
elements whose bits changed, and what shardsync put on the wire for them from a trainer
on one node to a rollout on another (CPU agents, coordinator --delta always) against a
full sync. Every sync is checked bit for bit against the trainer's weights.

    bazel run //bench/delta:adamw_delta -- --steps 6 --lr 1e-6 1e-5
"""

import argparse
import json
import math
import sys
import tempfile
import time
from typing import Dict, List

import torch
import torch.nn.functional as F

from shardsync.client import AgentClient, CoordinatorClient
from shardsync.integrations import EngineTarget, TrainerSource, module_sources, module_targets
from shardsync.testing import LocalCluster

AGENT = "daemon/agent/shardsync-agent"
COORDINATOR = "daemon/coordinator/shardsync-coordinator"


class Decoder(torch.nn.Module):
    """A Llama-shaped decoder: embeddings, per layer attention (q, k, v, o) and a gated
    MLP with RMS norms, a final norm and an untied head; linear weights ~ N(0, 0.02)."""

    def __init__(self, vocab: int, hidden: int, intermediate: int, layers: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.embed = torch.nn.Embedding(vocab, hidden)
        self.layers = torch.nn.ModuleList()
        for _ in range(layers):
            layer = torch.nn.ModuleDict({name: torch.nn.Linear(i, o, bias=False) for name, (i, o) in {
                "q": (hidden, hidden), "k": (hidden, hidden), "v": (hidden, hidden), "o": (hidden, hidden),
                "gate": (hidden, intermediate), "up": (hidden, intermediate), "down": (intermediate, hidden)}.items()})
            layer["attn_norm"] = torch.nn.Module()
            layer["mlp_norm"] = torch.nn.Module()
            layer["attn_norm"].weight = torch.nn.Parameter(torch.ones(hidden))
            layer["mlp_norm"].weight = torch.nn.Parameter(torch.ones(hidden))
            self.layers.append(layer)
        self.norm = torch.nn.Parameter(torch.ones(hidden))
        self.head = torch.nn.Linear(hidden, vocab, bias=False)
        for name, param in self.named_parameters():
            if param.dim() == 2:
                torch.nn.init.normal_(param, std=0.02)

    @staticmethod
    def rms(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        batch, seq, hidden = x.shape
        mask = torch.full((seq, seq), float("-inf")).triu(1)
        for layer in self.layers:
            h = self.rms(x, layer["attn_norm"].weight)
            q, k, v = (layer[n](h).view(batch, seq, self.heads, -1).transpose(1, 2) for n in ("q", "k", "v"))
            scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]) + mask
            x = x + layer["o"]((scores.softmax(-1) @ v).transpose(1, 2).reshape(batch, seq, hidden))
            h = self.rms(x, layer["mlp_norm"].weight)
            x = x + layer["down"](F.silu(layer["gate"](h)) * layer["up"](h))
        return self.head(self.rms(x, self.norm))


def bf16_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A bfloat16 module of the same parameters (the trainer's published weights)."""
    import copy
    out = copy.deepcopy(model).to(torch.bfloat16)
    for param in out.parameters():
        param.requires_grad_(False)
    return out


def bits(module: torch.nn.Module) -> Dict[str, torch.Tensor]:
    return {name: p.detach().view(torch.int16).clone() for name, p in module.named_parameters()}


def run(lr: float, steps: int, args: argparse.Namespace, logs: str) -> List[dict]:
    torch.manual_seed(args.seed)
    masters = Decoder(args.vocab, args.hidden, args.intermediate, args.layers, args.heads)
    weights = bf16_copy(masters)
    rollout = bf16_copy(masters)
    for param in rollout.parameters():
        param.data.fill_(float("nan"))  # poisoned: only a sync fills it
    optimizer = torch.optim.AdamW(masters.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1)
    cluster = LocalCluster(None, 2, logs, agent_bin=AGENT, coordinator_bin=COORDINATOR, staging_bytes=args.staging,
                           nodes=["node-a", "node-b"], coordinator_flags=["--delta", "always"])
    handles = []
    rows = []
    try:
        handles.append(TrainerSource(AgentClient(cluster.socket(0)), "trainer-0", lambda: module_sources(weights)))
        handles.append(EngineTarget(AgentClient(cluster.socket(1)), "rollout-1", lambda: module_targets(rollout)))
        coordinator = CoordinatorClient(cluster.coordinator, insecure=True)
        before = None
        for step in range(steps + 1):
            if step > 0:
                tokens = torch.randint(0, args.vocab, (args.batch, args.seq + 1))
                logits = masters(tokens[:, :-1])
                loss = F.cross_entropy(logits.reshape(-1, args.vocab), tokens[:, 1:].reshape(-1))
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                with torch.no_grad():
                    for w, m in zip(weights.parameters(), masters.parameters()):
                        w.copy_(m)  # rounded to bfloat16 in place: the registered memory
            now = bits(weights)
            changed = total = 0
            for name, b in now.items():
                total += b.numel()
                if before is not None:
                    changed += int((b != before[name]).sum())
            start = time.perf_counter()
            response = coordinator.sync(timeout=120)
            seconds = time.perf_counter() - start
            for name, param in rollout.named_parameters():
                if not torch.equal(param.detach().view(torch.int16), now[name]):
                    raise SystemExit(f"lr {lr} step {step}: {name} differs from the trainer's weights")
            wire = sum(r.wire_bytes for r in response.ranks)
            full = sum(r.sent_bytes - r.direct_sent_bytes for r in response.ranks)
            whole: Dict[str, int] = {}
            for r in response.ranks:
                for why, chunks in r.full_chunks.items():
                    whole[why] = whole.get(why, 0) + chunks
            rows.append({"lr": lr, "step": step, "elements": total,
                         "changed_fraction": changed / total if before is not None else None,
                         "wire_bytes": wire, "full_bytes": full, "wire_fraction": wire / full,
                         "delta_chunks": sum(r.delta_chunks for r in response.ranks), "chunks_sent_whole": whole,
                         "sync_seconds": round(seconds, 3), "exact": True})
            print(json.dumps(rows[-1]), flush=True)
            before = now
    finally:
        for handle in handles:
            handle.close()
        cluster.stop()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--lr", type=float, nargs="+", default=[1e-6, 1e-5])
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--hidden", type=int, default=384)
    parser.add_argument("--intermediate", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--heads", type=int, default=6)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--staging", type=int, default=1 << 22, help="the coordinator's --staging-bytes")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    logs = tempfile.mkdtemp(prefix="ss-adamw-")
    for lr in args.lr:
        rows = run(lr, args.steps, args, logs)
        later = [r for r in rows if r["step"] > 0]
        print(f"lr {lr:g}: bf16 elements changed per step "
              + ", ".join(f"{100 * r['changed_fraction']:.2f}%" for r in later)
              + "; wire / full " + ", ".join(f"{100 * r['wire_fraction']:.2f}%" for r in later), file=sys.stderr)


if __name__ == "__main__":
    main()
