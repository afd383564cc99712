"""What the integration tests share: a module holding a checkpoint's tensors under its
names, random checkpoints, and the oracle, an engine stand-in loaded by its own loader
from the full checkpoint, compared byte for byte with an engine a sync filled."""

import torch

from standins import vllm_qwen3

__all__ = ["CheckpointModule", "differences", "loaded_engine", "random_checkpoint", "random_masters"]


class CheckpointModule(torch.nn.Module):
    """A module whose parameters are a checkpoint's tensors, under their names (as a
    Hugging Face model's are)."""

    def __init__(self, shapes, dtype=torch.bfloat16):
        super().__init__()
        for name, shape in shapes.items():
            *path, leaf = name.split(".")
            owner = self
            for part in path:
                if not hasattr(owner, part):
                    owner.add_module(part, torch.nn.Module())
                owner = getattr(owner, part)
            owner.register_parameter(leaf, torch.nn.Parameter(torch.empty(shape, dtype=dtype)))


def random_checkpoint(shapes, seed):
    """bfloat16 tensors of `shapes`, random from `seed`."""
    generator = torch.Generator().manual_seed(seed)
    return {name: torch.randn(shape, generator=generator).to(torch.bfloat16) for name, shape in shapes.items()}


def random_masters(shapes, seed):
    """float32 tensors of `shapes`, random from `seed` (fp32 masters)."""
    generator = torch.Generator().manual_seed(seed)
    return {name: torch.randn(shape, generator=generator) for name, shape in shapes.items()}


def loaded_engine(config, tp_rank, tp, checkpoint, load_weights=None, **options):
    """The oracle: a stand-in engine rank loaded by its own loader from the full checkpoint."""
    engine = vllm_qwen3.Qwen3ForCausalLM(config, tp_rank=tp_rank, tp_size=tp, **options)
    (load_weights or engine.load_weights)(checkpoint.items())
    return engine


def differences(engine, oracle):
    """Parameters whose bytes differ between two engine instances."""
    theirs = dict(oracle.named_parameters())
    return [name for name, param in engine.named_parameters()
            if not torch.equal(param.data.view(torch.int16), theirs[name].data.view(torch.int16))]
