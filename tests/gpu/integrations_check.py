"""FSDP2 trainers (real torch FSDP2) into a Hugging Face engine (real transformers) and
the vLLM stand-in (tests/python/standins/vllm_qwen3.py) at TP = the trainer's world,
through real daemons, for Qwen3 and Qwen3-MoE small configs (random weights). No
placement is written here: every side comes from shardsync.integrations.

  --device cuda: world 1, one CUDA agent on GPU 0
  --device cpu --world W: W processes on gloo (a CPU device mesh), W CPU agents
  --hsdp: HSDP, a (2, W/2) mesh of replicate x shard

Oracles, each independent of shardsync's layout code: the trainer's full weights saved
with save_pretrained and loaded back by transformers' own from_pretrained (the HF engine
must equal it byte for byte, and give the FSDP2 trainer's logits); the same checkpoint
loaded by the stand-in's own loader (each stand-in rank must equal it). Two syncs, new values
before the second.

Float8: the stand-in with a block-quantized float8 checkpoint (weight_block_size 128 x 128),
processed after loading as vLLM's CUTLASS kernels leave it, registered through
shardsync.integrations.vllm.WorkerExtension; the oracle is the stand-in's own loader given a
float8 checkpoint made from the trainer's full weights by the tests' PyTorch reference
quantizer (tests/gpu/float8_reference.py). Prints "ok ..." / "FAIL ..." and "N passed,
N failed".
"""

import argparse
import os
import sys
import tempfile
import traceback
from types import SimpleNamespace
from unittest import mock

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))

# The vocabulary (250) splits unevenly over 4 ranks (63, 63, 63, 61) and pads to 256 on
# the engine (zero fills); 3 experts leave FSDP2's 4th rank an empty router shard.
MODELS = ("qwen3", "qwen3-tied", "qwen3-moe", "qwen3-moe-3-experts")


def hf_model(kind):
    from transformers import Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM
    common = dict(vocab_size=250, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  head_dim=16, max_position_embeddings=64, tie_word_embeddings=kind == "qwen3-tied")
    if kind.startswith("qwen3-moe"):
        experts = 3 if kind.endswith("3-experts") else 4
        return Qwen3MoeForCausalLM, Qwen3MoeConfig(intermediate_size=96, num_experts=experts, num_experts_per_tok=2,
                                                   moe_intermediate_size=32, decoder_sparse_step=1, mlp_only_layers=[],
                                                   **common)
    return Qwen3ForCausalLM, Qwen3Config(intermediate_size=96, **common)


def standin_config(config):
    from standins import vllm_qwen3
    return vllm_qwen3.Qwen3Config(
        vocab_size=config.vocab_size, hidden_size=config.hidden_size, intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_hidden_layers, num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.num_key_value_heads, head_dim=config.head_dim,
        tie_word_embeddings=config.tie_word_embeddings, num_experts=getattr(config, "num_experts", 0),
        moe_intermediate_size=getattr(config, "moe_intermediate_size", 0))


def same_bytes(a, b):
    return (a.shape == b.shape and a.dtype == b.dtype and
            torch.equal(a.detach().cpu().view(torch.uint8), b.detach().cpu().view(torch.uint8)))


# Float8: hidden 320 leaves partial 64-column and 64-row blocks; every TP shard of 1, 2 or 4
# ranks is whole 128-row blocks, as vLLM requires.
FLOAT8 = dict(vocab_size=250, hidden_size=320, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, head_dim=128)


def float8_checkpoint(full, shapes):
    """The oracle's float8 checkpoint: each linear weight quantized by the reference, with
    its weight_scale_inv; the rest as the trainer holds it."""
    from float8_reference import reference_float8
    out = {}
    for name, tensor in full.items():
        scale_name = name[:-len("weight")] + "weight_scale_inv"
        if scale_name in shapes:
            out[name], out[scale_name] = reference_float8(tensor)
        else:
            out[name] = tensor
    return out


def check_float8(report, rank, world, device, socket, coordinator, mesh):
    """FSDP2 bfloat16 shards into float8 stand-in ranks at TP = world, registered through
    the vLLM worker extension; two syncs against the oracle; refusals."""
    from transformers import Qwen3Config, Qwen3ForCausalLM
    from torch.distributed.fsdp import fully_shard
    from shardsync.client import AgentClient, CoordinatorClient
    from shardsync.integrations import TrainerSource, fsdp2_sources, loader_targets
    from shardsync.integrations.vllm import WorkerExtension
    from standins import vllm_qwen3

    class StandinWorker(WorkerExtension):
        """vLLM's worker as its worker extension sees it: model_runner.model, model_config,
        device, rank."""

        def __init__(self, model):
            self.model_runner, self.rank, self.device = SimpleNamespace(model=model), rank, device
            self.model_config = SimpleNamespace(enable_sleep_mode=False)

    vllm_qwen3.install_as_vllm()
    config = Qwen3Config(max_position_embeddings=64, **FLOAT8)
    torch.manual_seed(1)
    trainer = Qwen3ForCausalLM(config).to(torch.bfloat16).to(device)
    for layer in trainer.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(trainer, mesh=mesh)
    source = TrainerSource(AgentClient(socket), f"trainer8-{rank}", lambda: fsdp2_sources(trainer))
    scfg = vllm_qwen3.Qwen3Config(weight_block_size=(128, 128), **FLOAT8)
    shapes = vllm_qwen3.checkpoint_shapes(scfg)

    def engine():
        return vllm_qwen3.Qwen3ForCausalLM(scfg, tp_rank=rank, tp_size=world, device=device)

    live = engine()
    for p in live.parameters():
        p.data.view(torch.uint8).fill_(0xff)  # NaN in every dtype: each byte must come from the sync
    vllm_qwen3.process_weights_after_loading(live)
    report.check(all(type(p) is torch.nn.Parameter for p in live.parameters()),
                 "float8: the live stand-in holds plain Parameters after processing, as vLLM's does")
    worker = StandinWorker(live)
    worker.shardsync_register(socket, "vllm8", shapes)
    for step in (1, 2):
        if step == 2:
            with torch.no_grad():
                for p in trainer.parameters():
                    p.to_local().mul_(-0.5).add_(0.25)
        if device.type == "cuda":
            torch.cuda.synchronize()
        dist.barrier()
        if rank == 0:
            response = CoordinatorClient(coordinator, insecure=True).sync(timeout=120, verify=True)
            report.check(response.quantized_bytes > 0 and response.unverified_quantized_placements > 0,
                         f"float8 sync {step}: {response.quantized_bytes} bytes quantized, "
                         f"{response.unverified_quantized_placements} placements left to this oracle")
        dist.barrier()
        full = {name: p.full_tensor() for name, p in trainer.named_parameters()}
        loaded = engine()
        loaded.load_weights((n, t.to(device)) for n, t in float8_checkpoint(full, shapes).items())
        vllm_qwen3.process_weights_after_loading(loaded)
        theirs = dict(loaded.named_parameters())
        wrong = [n for n, p in live.named_parameters() if not same_bytes(p, theirs[n])]
        report.check(not wrong and any(p.dtype == torch.float8_e4m3fn for p in theirs.values()),
                     f"float8 sync {step}: stand-in TP rank {rank} of {world} equals its own load of the "
                     f"reference-quantized checkpoint {wrong}")
    worker.shardsync_close()
    source.close()
    dist.barrier()
    if rank != 0:
        return
    # Refusals, before anything is registered.
    with mock.patch.dict(vllm_qwen3.DEEP_GEMM_E8M0, {"used": True}):
        check_refused(report, "DeepGEMM's power-of-two scales", ("VLLM_USE_DEEP_GEMM_E8M0=0",),
                      lambda: StandinWorker(engine()).shardsync_register(socket, "e8m0", shapes))
    with mock.patch.dict(sys.modules):
        del sys.modules["vllm.model_executor.model_loader.reload.layerwise"]
        check_refused(report, "a vLLM without its record for reloading", ("no record of its layers",),
                      lambda: StandinWorker(engine()).shardsync_register(socket, "unrecorded", shapes))
    # Loaders that put a block or a scale where the engine's blocks do not line up.
    for shift, transpose, expected in ((64, False, "cut a 128 x 128 block"), (0, True, "where the scale of block")):
        layer = Misplaced(shift, transpose)
        check_refused(report, f"a loader that misplaces {'scales' if transpose else 'rows'}",
                      ("checkpoint tensor 'a.weight' in float8 parameter 'weight'", expected),
                      lambda: loader_targets(layer, layer.load_weights,
                                             {"a.weight": (256 - shift, 256), "a.weight_scale_inv": (2, 2)}))


def check_refused(report, what, expected, register):
    """`register()` raises ProbeError saying each of `expected`."""
    from shardsync.integrations import ProbeError
    try:
        register()
        report.check(False, f"float8: {what} is refused")
    except ProbeError as error:
        report.check(all(e in str(error) for e in expected), f"float8: {what} is refused: {error}")


class Misplaced(torch.nn.Module):
    """One float8 layer whose loader puts checkpoint 'a.weight' from row `shift` on, or
    its scales transposed: neither is where the layer's 128 x 128 blocks are."""

    def __init__(self, shift, transpose):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(256, 256, dtype=torch.float8_e4m3fn), requires_grad=False)
        self.weight_scale_inv = torch.nn.Parameter(torch.empty(2, 2), requires_grad=False)
        self.shift, self.transpose = shift, transpose

    def load_weights(self, weights):
        for name, tensor in weights:
            if name == "a.weight":
                self.weight.data[self.shift:].copy_(tensor)
            else:
                self.weight_scale_inv.data.copy_(tensor.t() if self.transpose else tensor)


class Report:
    def __init__(self, rank):
        self.rank, self.passed, self.failed = rank, 0, 0

    def check(self, ok, what):
        print(f"{'ok' if ok else 'FAIL'} [rank {self.rank}] {what}", flush=True)
        self.passed += bool(ok)
        self.failed += not ok


def run(rank, world, device_kind, hsdp, sockets, coordinator, port, folder, results):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from safetensors.torch import load_file
    from shardsync.client import AgentClient, CoordinatorClient
    from shardsync.integrations import EngineTarget, TrainerSource, fsdp2_sources, loader_targets, module_targets
    from standins import vllm_qwen3

    report = Report(rank)
    dist.init_process_group("nccl" if device_kind == "cuda" else "gloo", rank=rank, world_size=world,
                            init_method=f"tcp://127.0.0.1:{port}")
    device = torch.device("cuda", 0) if device_kind == "cuda" else torch.device("cpu")
    if device_kind == "cuda":
        torch.cuda.set_device(0)
    # HSDP: two replicas, each sharded over half the ranks.
    mesh = (init_device_mesh(device_kind, (2, world // 2), mesh_dim_names=("replicate", "shard")) if hsdp
            else init_device_mesh(device_kind, (world,)))
    agent = AgentClient(sockets[rank])
    try:
        for kind in MODELS:
            cls, config = hf_model(kind)
            torch.manual_seed(0)  # the same initial weights on every rank
            trainer = cls(config).to(torch.bfloat16).to(device)
            for layer in trainer.model.layers:
                fully_shard(layer, mesh=mesh)
            fully_shard(trainer, mesh=mesh)
            handles = [TrainerSource(agent, f"trainer-{rank}", lambda: fsdp2_sources(trainer))]
            hf = None
            if rank == 0:
                hf = cls(config).to(torch.bfloat16).to(device)
                for p in hf.parameters():
                    p.data.fill_(float("nan"))
                handles.append(EngineTarget(agent, "hf-0", lambda: module_targets(hf)))
            scfg = standin_config(config)
            shapes = vllm_qwen3.checkpoint_shapes(scfg)
            # vLLM refuses a MoE with fewer experts than TP ranks; the HF engine still runs.
            standin = None
            if scfg.num_experts == 0 or world <= scfg.num_experts:
                standin = vllm_qwen3.Qwen3ForCausalLM(scfg, tp_rank=rank, tp_size=world, device=device)
                for p in standin.parameters():
                    p.data.fill_(float("nan"))
                handles.append(EngineTarget(agent, f"vllm-{rank}",
                                            lambda: loader_targets(standin, standin.load_weights, shapes)))
            for step in (1, 2):
                if step == 2:  # new values, in place, the same on every replica of a shard (HSDP)
                    with torch.no_grad():
                        for p in trainer.parameters():
                            p.to_local().mul_(-0.5).add_(0.25)
                if device_kind == "cuda":
                    torch.cuda.synchronize()  # the trainer's writes complete before the sync reads them
                dist.barrier()
                if rank == 0:
                    response = CoordinatorClient(coordinator, insecure=True).sync(timeout=120, verify=True)
                    report.check(len(response.ranks) == world, f"{kind} sync {step}: every rank took part, verified")
                dist.barrier()
                full = {name: p.full_tensor() for name, p in trainer.named_parameters()}
                ids = torch.randint(0, config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(step))
                with torch.no_grad():
                    expected_logits = trainer(ids.to(device)).logits  # FSDP2's forward: every rank takes part
                trainer.reshard()  # a forward without backward leaves the root's parameters unsharded
                if rank == 0:
                    reference = cls(config).to(torch.bfloat16)
                    # Tied weights: named_parameters() has the embedding once; the module ties lm_head to it.
                    missing, unexpected = reference.load_state_dict({k: v.cpu() for k, v in full.items()}, strict=False)
                    report.check(set(missing) <= {"lm_head.weight"} and not unexpected,
                                 f"{kind} sync {step}: the trainer's weights are the model's {missing} {unexpected}")
                    reference.save_pretrained(folder)
                dist.barrier()
                checkpoint = {}
                for name in sorted(os.listdir(folder)):
                    if name.endswith(".safetensors"):
                        checkpoint.update(load_file(os.path.join(folder, name)))
                report.check(set(checkpoint) == set(shapes),
                             f"{kind} sync {step}: the saved checkpoint has the stand-in's tensor names")
                if rank == 0:
                    oracle = cls.from_pretrained(folder, dtype=torch.bfloat16).to(device)
                    theirs = dict(oracle.named_parameters())
                    wrong = [n for n, p in hf.named_parameters() if not same_bytes(p, theirs[n])]
                    report.check(not wrong, f"{kind} sync {step}: the HF engine equals from_pretrained's model {wrong}")
                    with torch.no_grad():
                        logits = hf(ids.to(device)).logits
                    difference = (logits.float() - expected_logits.float()).abs().max().item()
                    report.check(same_bytes(logits, expected_logits),
                                 f"{kind} sync {step}: the HF engine's logits are the trainer's (largest difference "
                                 f"{difference})")
                if standin is not None:
                    loaded = vllm_qwen3.Qwen3ForCausalLM(scfg, tp_rank=rank, tp_size=world, device=device)
                    loaded.load_weights((n, t.to(device)) for n, t in checkpoint.items())
                    theirs = dict(loaded.named_parameters())
                    wrong = [n for n, p in standin.named_parameters() if not same_bytes(p, theirs[n])]
                    report.check(not wrong, f"{kind} sync {step}: vLLM stand-in TP rank {rank} of {world} equals its "
                                            f"own load of the checkpoint {wrong}")
            for handle in handles:
                handle.close()
            dist.barrier()
        check_float8(report, rank, world, device, sockets[rank], coordinator, mesh)
    except Exception:
        traceback.print_exc()
        report.check(False, "no exception")
    finally:
        dist.destroy_process_group()
    results.put((report.passed, report.failed))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin", required=True, help="folder of shardsync-agent and shardsync-coordinator")
    parser.add_argument("--device", choices=["cuda", "cpu"], required=True)
    parser.add_argument("--world", type=int, default=1)
    parser.add_argument("--hsdp", action="store_true", help="a (2, world/2) mesh: replicate x shard")
    parser.add_argument("--logs", default=tempfile.mkdtemp(prefix="ss-integrations-"))
    args = parser.parse_args()
    if args.device == "cuda" and args.world != 1:
        parser.error("--device cuda runs world 1 (several agents on one GPU need the direct path)")
    if args.hsdp and args.world % 2:
        parser.error("--hsdp needs an even world")
    from shardsync.testing import LocalCluster
    cluster = LocalCluster(args.bin, args.world, args.logs, cuda=args.device == "cuda", staging_bytes=1 << 20)
    try:
        context = mp.get_context("spawn")
        results = context.Queue()
        port = 29500 + os.getpid() % 1000
        folder = tempfile.mkdtemp(prefix="ss-checkpoint-")  # rank 0 saves the oracle's checkpoint, all read it
        workers = [context.Process(target=run, args=(r, args.world, args.device, args.hsdp,
                                                     [cluster.socket(i) for i in range(args.world)],
                                                     cluster.coordinator, port, folder, results))
                   for r in range(args.world)]
        for w in workers:
            w.start()
        for w in workers:
            w.join(timeout=600)
        passed = failed = 0
        while not results.empty():
            p, f = results.get()
            passed, failed = passed + p, failed + f
        failed += sum(1 for w in workers if w.exitcode != 0)
    finally:
        cluster.stop()
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed or not passed else 0)


if __name__ == "__main__":
    main()
