"""Trainers and engines joined through shardsync.integrations against real daemons (CPU
agents): no placement is written by hand here. The oracle is independent of shardsync's
layout code: an engine instance loaded by its own loader from the trainer's full
checkpoint must equal, parameter by parameter and byte by byte, the instance a sync
filled from the sharded trainer.

What ran against what: the engine is the vLLM stand-in (tests/python/standins/
vllm_qwen3.py, vLLM's Qwen3 and Qwen3-MoE loading code paths; vLLM cannot be installed
here); the ZeRO trainers are the DeepSpeed stand-in (tests/python/standins/
deepspeed_zero.py); the plain-module trainer is a real torch module named as Hugging Face
names a checkpoint.
"""

import itertools
import math
import os
import subprocess
import sys
import tempfile
import time
import unittest
from types import SimpleNamespace
from unittest import mock

import grpc
import torch

from shardsync.client import AgentClient, CoordinatorClient, DescriptorBuffer, ShardsyncError
from shardsync.integrations import (EngineTarget, ProbeError, TrainerSource, loader_targets, module_sources,
                                    module_targets, zero3_sources, zero12_master_sources)
from shardsync.integrations.memory import tensor_buffer
from shardsync.integrations.modules import checkpoint_name, safetensors_shapes, segments
from shardsync.integrations.probe import Piece
from shardsync.integrations.sources import namespaced
from shardsync.integrations.targets import _elements, piece_scales
from shardsync.integrations.vllm import WorkerExtension, created_parameters
from shardsync.layouts import tensor_layout
from shardsync.testing import LocalCluster

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model_oracle import CheckpointModule, differences, loaded_engine, random_checkpoint, random_masters  # noqa: E402
from standins import deepspeed_zero, vllm_qwen3  # noqa: E402

AGENT = "daemon/agent/shardsync-agent"
COORDINATOR = "daemon/coordinator/shardsync-coordinator"
WORLD = 4  # agents; trainer DP ranks and engine TP ranks both live on them

DENSE = vllm_qwen3.Qwen3Config(vocab_size=150, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2, head_dim=8)
TIED = vllm_qwen3.Qwen3Config(**{**DENSE.__dict__, "tie_word_embeddings": True})
MOE = vllm_qwen3.Qwen3Config(**{**DENSE.__dict__, "num_experts": 4, "moe_intermediate_size": 16})


def private_dir(prefix):
    """A new folder under Bazel's $TEST_TMPDIR (outside Bazel, the system's temporary
    folder). LocalCluster keeps the unix sockets in a short folder of its own."""
    return tempfile.mkdtemp(prefix=prefix, dir=os.environ.get("TEST_TMPDIR"))


class IntegrationsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        logs = private_dir("ss-integrations-")
        cls.cluster = LocalCluster(None, WORLD, logs, agent_bin=AGENT, coordinator_bin=COORDINATOR,
                                   staging_bytes=1 << 20)
        cls.coordinator = CoordinatorClient(cls.cluster.coordinator, insecure=True)
        deadline = time.monotonic() + 60  # only a hang exceeds it
        while len(cls.coordinator.status().agents) < WORLD:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the agents did not all join: {cls.coordinator.status()}")
            time.sleep(0.01)

    @classmethod
    def tearDownClass(cls):
        cls.cluster.stop()

    def setUp(self):
        self.handles = []

    def tearDown(self):
        for handle in self.handles:
            handle.close()

    def agent(self, rank):
        return AgentClient(self.cluster.socket(rank))

    def zero3_trainer(self, shapes, checkpoint, dp):
        """DeepSpeed ZeRO-3 (stand-in) over DP ranks 0..dp-1, each registered with its agent."""
        modules = []
        for rank in range(dp):
            module = CheckpointModule(shapes)
            deepspeed_zero.partition_zero3(module, rank, dp, checkpoint)
            self.handles.append(TrainerSource(self.agent(rank), f"trainer-{rank}",
                                              lambda m=module: zero3_sources(m, rank_of=lambda g: g.rank,
                                                                               world_of=lambda g: g.world)))
            modules.append(module)
        return modules

    def engines(self, config, tp, **options):
        """Stand-in vLLM engine ranks 0..tp-1 on agents 0..tp-1, registered through their loader."""
        shapes = vllm_qwen3.checkpoint_shapes(config)
        out = []
        for rank in range(tp):
            engine = vllm_qwen3.Qwen3ForCausalLM(config, tp_rank=rank, tp_size=tp, **options)
            for param in engine.parameters():
                param.data.fill_(float("nan"))  # poison: every byte must come from the sync
            self.handles.append(EngineTarget(self.agent(rank), f"rollout-{rank}",
                                             lambda e=engine: loader_targets(e, e.load_weights, shapes)))
            out.append(engine)
        return out

    def sync(self):
        response = self.coordinator.sync(timeout=60, verify=True)
        self.assertTrue(response.ranks, "the sync reports its ranks")
        return response

    def check_engine_pair(self, config, tp, **options):
        """ZeRO-3 over 4 ranks into one TP=tp engine replica: exact against the oracle after
        two syncs with new values."""
        shapes = vllm_qwen3.checkpoint_shapes(config)
        first = random_checkpoint(shapes, 1)
        trainers = self.zero3_trainer(shapes, first, WORLD)
        engines = self.engines(config, tp, **options)
        for seed, checkpoint in ((1, first), (2, random_checkpoint(shapes, 2))):
            for module in trainers:
                deepspeed_zero.refill_zero3(module, checkpoint)
            self.sync()
            for rank, engine in enumerate(engines):
                with self.subTest(seed=seed, tp_rank=rank):
                    self.assertEqual(differences(engine, loaded_engine(config, rank, tp, checkpoint, **options)), [])

    def test_zero3_into_vllm_dense_at_tp_1_2_4(self):
        for tp in (1, 2, 4):
            with self.subTest(tp=tp):
                self.check_engine_pair(DENSE, tp)
                self.tearDown()
                self.setUp()

    def test_zero3_into_vllm_tied_embeddings_at_tp_2(self):
        self.check_engine_pair(TIED, 2)

    def test_zero3_into_vllm_moe_at_tp_2_and_with_expert_parallel(self):
        self.check_engine_pair(MOE, 2)
        self.tearDown()
        self.setUp()
        self.check_engine_pair(MOE, 4, enable_expert_parallel=True)

    def test_zero12_bf16_flats_on_every_rank_into_vllm_at_tp_2(self):
        """ZeRO-1/2 (stand-in): every DP rank holds the whole bf16 flat; the planner picks
        which replica sends each piece."""
        shapes = vllm_qwen3.checkpoint_shapes(DENSE)
        checkpoint = random_checkpoint(shapes, 5)
        for rank in range(WORLD):
            module = CheckpointModule(shapes)
            deepspeed_zero.Zero12Optimizer(module, rank, WORLD, checkpoint)
            self.handles.append(TrainerSource(self.agent(rank), f"trainer-{rank}", lambda m=module: module_sources(m)))
        engines = self.engines(DENSE, 2)
        self.sync()
        for rank, engine in enumerate(engines):
            self.assertEqual(differences(engine, loaded_engine(DENSE, rank, 2, checkpoint)), [])

    def check_masters(self, make_optimizer, frozen=()):
        """fp32 master partitions from `make_optimizer(module, rank, masters)` (a stand-in
        of DeepSpeed's ZeRO-1/2 optimizers) on every DP rank into the bf16 stand-in at TP
        2, parameters named in `frozen` not trained: equal to the stand-in loading the
        masters converted by torch, the frozen ones from their bf16 memory."""
        shapes = vllm_qwen3.checkpoint_shapes(DENSE)
        masters = random_masters(shapes, 6)
        for rank in range(WORLD):
            module = CheckpointModule(shapes)
            for name in frozen:
                module.get_parameter(name).requires_grad_(False)
            optimizer = make_optimizer(module, rank, masters)
            self.handles.append(TrainerSource(
                self.agent(rank), f"trainer-{rank}",
                lambda o=optimizer, m=module: zero12_master_sources(o, m, rank_of=lambda g: g.rank)))
        engines = self.engines(DENSE, 2)
        self.sync()
        converted = {name: value.to(torch.bfloat16) for name, value in masters.items()}
        for rank, engine in enumerate(engines):
            self.assertEqual(differences(engine, loaded_engine(DENSE, rank, 2, converted)), [])

    def test_zero12_fp32_masters_into_bf16_targets_the_sender_converting(self):
        """ZeRO-2 in round-robin order, ``partition_size`` a float as DeepSpeed holds it."""
        self.check_masters(lambda module, rank, masters: deepspeed_zero.Zero12Optimizer(
            module, rank, WORLD, masters, round_robin=True))

    def test_zero12_frozen_parameters_come_from_their_bf16_memory(self):
        """Two parameter groups, the norms and an embedding frozen: DeepSpeed keeps no
        master of them, so their bf16 weights are the source."""
        shapes = vllm_qwen3.checkpoint_shapes(DENSE)
        frozen = ["model.embed_tokens.weight"] + [name for name in shapes if "norm" in name]
        trained = [name for name in shapes if name not in frozen]
        groups = [[name for name in trained if "mlp" in name], [name for name in trained if "mlp" not in name]]
        self.check_masters(lambda module, rank, masters: deepspeed_zero.Zero12Optimizer(
            module, rank, WORLD, masters, round_robin=True, param_groups=groups), frozen=frozen)

    def test_bf16_optimizer_masters_into_bf16_targets(self):
        """ZeRO-1 with bf16 and fp32 gradient accumulation runs BF16_Optimizer, whose flat
        and partitions have other names and no partition_size."""
        self.check_masters(lambda module, rank, masters: deepspeed_zero.Bf16Optimizer(
            module, rank, WORLD, masters), frozen=["model.norm.weight"])

    def test_zero3_partitions_that_cannot_be_read_are_refused_naming_the_parameter(self):
        shapes = {"a.w": (3, 5), "b": (7,)}
        module = CheckpointModule(shapes)
        deepspeed_zero.partition_zero3(module, 1, 2, random_checkpoint(shapes, 9))
        rank, world = (lambda g: g.rank), (lambda g: g.world)
        self.assertEqual(len(zero3_sources(module, rank_of=rank, world_of=world)[1]), 2)
        with self.assertRaisesRegex(ValueError, "parameter 'b': rank 5 is outside its process group of 2"):
            zero3_sources(module, rank_of=lambda g: 5, world_of=world)
        with self.assertRaisesRegex(ValueError, "parameter 'b': 1 partitions of 4 elements cannot hold its 7"):
            zero3_sources(module, rank_of=lambda g: 0, world_of=lambda g: 1)
        module.a.w.ds_shape = (-3, -5)
        with self.assertRaisesRegex(ValueError, r"parameter 'a.w': ds_shape \[-3, -5\] does not hold ds_numel 15"):
            zero3_sources(module, rank_of=rank, world_of=world)
        module.a.w.ds_shape = (3, 5)
        del module.b.ds_process_group
        with self.assertRaisesRegex(ValueError, "parameter 'b' has a ds_tensor but no ds_process_group"):
            zero3_sources(module, rank_of=rank, world_of=world)

    def test_zero12_masters_of_a_rank_outside_the_group_are_refused(self):
        module = CheckpointModule({"a": (4,), "b": (6,)})
        optimizer = deepspeed_zero.Zero12Optimizer(module, 0, 2, {"a": torch.ones(4), "b": torch.ones(6)})
        with self.assertRaisesRegex(ValueError, "parameter group 0: rank 7 holds no partition of 6 elements"):
            zero12_master_sources(optimizer, module, rank_of=lambda g: 7)

    def test_zero12_masters_offloaded_from_the_weights_device_are_refused_before_memory_is_shared(self):
        module = CheckpointModule({"a": (4,), "b": (6,)})
        optimizer = deepspeed_zero.Zero12Optimizer(module, 0, 2, {"a": torch.ones(4), "b": torch.ones(6)},
                                                   param_groups=[["a"], ["b"]])
        # offload_optimizer: the masters on another device than the bit16 flat.
        optimizer.single_partition_of_fp32_groups[1] = optimizer.single_partition_of_fp32_groups[1].to("meta")
        with self.assertRaisesRegex(ValueError, r"parameter group 1: the fp32 masters are on meta and the bit16 "
                                                r"weights on cpu \(DeepSpeed's offload_optimizer"):
            zero12_master_sources(optimizer, module, rank_of=lambda g: 0)
        self.assertFalse(any(t.is_shared() for t in optimizer.bit16_groups_flat + optimizer.single_partition_of_fp32_groups[:1]))

    def test_an_optimizer_without_fp32_partitions_is_refused_by_name(self):
        module = CheckpointModule({"w": (4,)})
        with self.assertRaisesRegex(ValueError, "optimizer SGD holds no ZeRO-1/2 fp32 partitions"):
            zero12_master_sources(torch.optim.SGD(module.parameters(), lr=0.1), module, rank_of=lambda g: 0)

    def test_a_parameter_outside_its_groups_flat_is_refused_by_name(self):
        module = CheckpointModule({"a": (4,), "b": (6,)})
        optimizer = deepspeed_zero.Zero12Optimizer(module, 0, 1, {"a": torch.ones(4), "b": torch.ones(6)})
        module.b.data = module.b.data.clone()  # moved out of the flat
        with self.assertRaisesRegex(ValueError, "parameter 'b' is not a view of its group's bit16 flat"):
            zero12_master_sources(optimizer, module, rank_of=lambda g: 0)

    def test_an_engine_whose_memory_moved_registers_again_and_says_its_version(self):
        shapes = vllm_qwen3.checkpoint_shapes(DENSE)
        checkpoint = random_checkpoint(shapes, 7)
        self.zero3_trainer(shapes, checkpoint, WORLD)
        engine = self.engines(DENSE, 1)[0]
        target = self.handles[-1]
        first = self.sync()
        target.resume(first.sync_id)
        self.assertEqual(target.version, first.sync_id)
        self.assertEqual(target.weight_version(), first.sync_id)
        old = {name: param.data for name, param in engine.named_parameters()}
        for param in engine.parameters():  # the engine's memory moves (sleep and wake, say)
            param.data = torch.full_like(param.data, float("nan"))
        target.reregister()
        second = self.sync()
        self.assertEqual(target.weight_version(), second.sync_id)
        self.assertEqual(differences(engine, loaded_engine(DENSE, 0, 1, checkpoint)), [])
        for name, data in old.items():  # the old memory is no target any more; it kept the first sync's bytes
            self.assertFalse(torch.isnan(data.float()).any(), name)

    def test_a_wrong_derivation_is_caught_by_the_oracle(self):
        """Placements derived from a loader that takes the wrong k/v heads (a broken
        derivation) sync without error, and the oracle names the parameters they
        corrupted."""
        shapes = vllm_qwen3.checkpoint_shapes(DENSE)
        checkpoint = random_checkpoint(shapes, 3)
        self.zero3_trainer(shapes, checkpoint, WORLD)
        tp = 4  # 2 kv heads over 4 ranks: rank r takes kv head r // 2
        engines = []
        for rank in range(tp):
            engine = vllm_qwen3.Qwen3ForCausalLM(DENSE, tp_rank=rank, tp_size=tp)
            broken = vllm_qwen3.Qwen3ForCausalLM(DENSE, tp_rank=(rank + 2) % tp, tp_size=tp)
            # The broken instance's parameters, with their loaders, derive the placements of
            # this rank's memory: rank r receives the heads of rank r + 2.
            for (name, param), (_, other) in zip(engine.named_parameters(), broken.named_parameters()):
                other.data = param.data
            self.handles.append(EngineTarget(self.agent(rank), f"rollout-{rank}",
                                             lambda b=broken: loader_targets(b, b.load_weights, shapes)))
            engines.append(engine)
        self.sync()
        wrong = [name for rank, engine in enumerate(engines)
                 for name in differences(engine, loaded_engine(DENSE, rank, tp, checkpoint))]
        self.assertTrue(any("qkv_proj" in name for name in wrong), wrong)

    def test_layers_replaced_after_loading_are_probed_through_vllms_record(self):
        """Parameters replaced after loading by plain ones that keep only their loader (as
        vLLM's quantized layers leave them): vLLM's loaders no longer run on them, so the
        probe runs on vLLM's record of them as created (the stand-in keeps it as vLLM's
        initialize_model does), and the sync fills the live memory."""
        self.enterContext(mock.patch.dict(sys.modules))  # the stand-in's vLLM modules, for this test only
        vllm_qwen3.install_as_vllm()
        shapes = vllm_qwen3.checkpoint_shapes(DENSE)
        checkpoint = random_checkpoint(shapes, 5)
        trainers = self.zero3_trainer(shapes, checkpoint, WORLD)
        tp = 2
        engines = []
        for rank in range(tp):
            engine = vllm_qwen3.Qwen3ForCausalLM(DENSE, tp_rank=rank, tp_size=tp)
            for name, module in engine.named_modules():
                if name.endswith("_proj"):
                    vllm_qwen3.replace_parameter(module, "weight", module.weight.data.fill_(float("nan")))
            with self.assertRaises(AttributeError):  # e.g. a plain Parameter has no load_qkv_weight
                loader_targets(engine, engine.load_weights, vllm_qwen3.checkpoint_shapes(DENSE))
            self.handles.append(EngineTarget(
                self.agent(rank), f"rollout-{rank}",
                lambda e=engine: loader_targets(e, e.load_weights, shapes, created_parameters(e))))
            engines.append(engine)
        for module in trainers:
            deepspeed_zero.refill_zero3(module, checkpoint)
        self.sync()
        for rank, engine in enumerate(engines):
            self.assertEqual(differences(engine, loaded_engine(DENSE, rank, tp, checkpoint)), [])

    def test_vllm_workers_register_with_their_probes_in_files_when_asked(self):
        from shardsync.integrations import probe
        folder = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
        worker = WorkerExtension()
        worker.model_runner = SimpleNamespace(model=vllm_qwen3.Qwen3ForCausalLM(DENSE))
        worker.model_config = SimpleNamespace(enable_sleep_mode=False)
        worker.rank, worker.device = 0, torch.device("cpu")
        with mock.patch.object(probe.tempfile, "mkstemp", wraps=tempfile.mkstemp) as made:
            rank = worker.shardsync_register(self.cluster.socket(0), "vllm-files", vllm_qwen3.checkpoint_shapes(DENSE),
                                             probe_dir=folder)
        self.handles.append(worker._shardsync)
        self.assertEqual(rank, 0)
        self.assertGreater(made.call_count, 0)
        self.assertTrue(all(call.kwargs["dir"] == folder for call in made.call_args_list))
        self.assertEqual(os.listdir(folder), [])

    def test_sglang_registers_with_its_probes_in_files_when_its_environment_says(self):
        """SGLang's hook reads the agent's socket, the model folder (safetensors headers)
        and the probe's folder from the environment."""
        import json
        import struct
        from shardsync.integrations import probe, sglang
        model_dir = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
        header = json.dumps({name: {"dtype": "BF16", "shape": list(shape), "data_offsets": [0, 0]}
                             for name, shape in vllm_qwen3.checkpoint_shapes(DENSE).items()}).encode()
        with open(os.path.join(model_dir, "model.safetensors"), "wb") as f:
            f.write(struct.pack("<Q", len(header)) + header)
        folder = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
        environment = {"SHARDSYNC_SOCKET": self.cluster.socket(0), "SHARDSYNC_CHECKPOINT": model_dir,
                       "SHARDSYNC_CLIENT_ID": "sglang-files", "SHARDSYNC_PROBE_DIR": folder}
        with mock.patch.dict(os.environ, environment), \
                mock.patch.object(probe.tempfile, "mkstemp", wraps=tempfile.mkstemp) as made:
            sglang.register(vllm_qwen3.Qwen3ForCausalLM(DENSE), [])
        self.handles.append(sglang._targets.pop(0))
        self.assertGreater(made.call_count, 0)
        self.assertTrue(all(call.kwargs["dir"] == folder for call in made.call_args_list))
        self.assertEqual(os.listdir(folder), [])

    def test_vllm_in_sleep_mode_is_refused_by_name_before_any_agent_is_asked(self):
        worker = WorkerExtension()
        worker.model_runner = SimpleNamespace(model=vllm_qwen3.Qwen3ForCausalLM(DENSE))
        worker.model_config = SimpleNamespace(enable_sleep_mode=True)
        worker.rank, worker.device = 0, torch.device("cpu")
        with self.assertRaises(ShardsyncError) as refused:
            worker.shardsync_register(os.path.join(private_dir("ss-no-agent-"), "absent.sock"), "vllm",
                                      vllm_qwen3.checkpoint_shapes(DENSE))
        self.assertEqual(refused.exception.code, grpc.StatusCode.FAILED_PRECONDITION)
        self.assertIn("vLLM's sleep mode (enable_sleep_mode=True)", str(refused.exception))

    def test_a_live_parameter_unlike_its_record_is_refused_by_name(self):
        self.enterContext(mock.patch.dict(sys.modules))
        vllm_qwen3.install_as_vllm()
        engine = vllm_qwen3.Qwen3ForCausalLM(DENSE)
        mlp = engine.model.layers[1].mlp.gate_up_proj
        vllm_qwen3.replace_parameter(mlp, "weight", mlp.weight.data.t().contiguous())  # a processed layout
        with self.assertRaises(ProbeError) as refused:
            loader_targets(engine, engine.load_weights, vllm_qwen3.checkpoint_shapes(DENSE), created_parameters(engine))
        self.assertIn("'model.layers.1.mlp.gate_up_proj.weight' is [32, 96] torch.bfloat16 with strides [96, 1] in "
                      "the engine but was created [96, 32] torch.bfloat16 with strides [32, 1]", str(refused.exception))

    def test_the_live_parameters_are_back_after_a_probe_through_the_record_fails(self):
        self.enterContext(mock.patch.dict(sys.modules))
        vllm_qwen3.install_as_vllm()
        engine = vllm_qwen3.Qwen3ForCausalLM(DENSE)
        for name, module in engine.named_modules():
            if name.endswith("_proj"):
                vllm_qwen3.replace_parameter(module, "weight", module.weight.data)
        live = dict(engine.named_parameters())
        created = created_parameters(engine)
        created["model.norm.extra"] = torch.nn.Parameter(torch.empty(3), requires_grad=False)  # dropped later

        def failing(weights):
            engine.load_weights(weights)
            raise RuntimeError("the loader fails after loading")

        with self.assertRaisesRegex(RuntimeError, "fails after loading"):
            loader_targets(engine, failing, vllm_qwen3.checkpoint_shapes(DENSE), created)
        after = dict(engine.named_parameters())
        self.assertEqual(after.keys(), live.keys())
        self.assertTrue(all(after[name] is param and param.dtype == torch.bfloat16 for name, param in live.items()))

    def test_block_scales_of_float8_pieces_where_the_loader_put_the_checkpoints(self):
        """piece_scales on pieces as the probe reports them (no float8 dtype needed): the
        scale position of each block, checked against where the loader put the
        checkpoint's scales; pieces that cut a block refused."""
        def scales_at(tensor, base, row_stride, block_rows, block_cols, first=(0, 0)):
            return {base + i * row_stride + j: (tensor + "_scale_inv", first[0] + i, first[1] + j)
                    for i in range(block_rows) for j in range(block_cols)}

        # k of a fused qkv: rows [128, 256) of k_proj at parameter row 512, 320 columns.
        k = Piece("k_proj.weight", (128, 0), (256, 320), "qkv_proj.weight", 512 * 320, (320, 1))
        self.assertEqual(piece_scales(k, (768, 320), (256, 320), scales_at("k_proj.weight", 12, 3, 1, 3, (1, 0))),
                         (12, 3))
        # A partial last row block where the tensor and the parameter both end.
        down = Piece("down_proj.weight", (0, 0), (320, 128), "down_proj.weight", 0, (128, 1))
        self.assertEqual(piece_scales(down, (320, 128), (320, 256), scales_at("down_proj.weight", 0, 1, 3, 1)), (0, 1))
        # One row at a parameter's last block, 256 of its 384 columns (the probe gives a
        # one-row piece its own length as row stride).
        row = Piece("a.weight", (128, 0), (129, 256), "p", 128 * 384, (256, 1))
        self.assertEqual(piece_scales(row, (129, 384), (129, 256), scales_at("a.weight", 3, 3, 1, 2, (1, 0))), (3, 3))

        refusals = [
            # rows end inside a block the next tensor's rows share
            (Piece("gate.weight", (0, 0), (320, 128), "gate_up.weight", 0, (128, 1)), (640, 128), (320, 128),
             "cut a 128 x 128 block"),
            # a partial block of the checkpoint, where the checkpoint goes on
            (Piece("w.weight", (0, 0), (320, 128), "w.weight", 0, (128, 1)), (320, 128), (640, 128),
             "cut a 128 x 128 block"),
            (Piece("w.weight", (0, 0), (128, 128), "w.weight", 64 * 128, (128, 1)), (256, 128), (128, 128),
             "at parameter row 64"),
            (Piece("w.weight", (0, 0), (128, 128), "w.weight", 0, (256, 1)), (256, 128), (128, 128),
             "rows 256 elements apart"),
        ]
        for piece, param_shape, tensor_shape, expected in refusals:
            with self.subTest(expected=expected), self.assertRaises(ProbeError) as refused:
                piece_scales(piece, param_shape, tensor_shape, {})
            self.assertIn(expected, str(refused.exception))
            self.assertIn(f"'{piece.tensor}'", str(refused.exception))
        with self.assertRaises(ProbeError) as refused:  # a 1-D tensor loaded into a scale parameter
            _elements(Piece("s", (0,), (4,), "w_scale_inv", 0, (1,)))
        self.assertIn("1-D checkpoint tensor 's' into scale parameter 'w_scale_inv'", str(refused.exception))
        swapped = scales_at("k_proj.weight", 12, 3, 1, 3, (1, 0))
        swapped[12], swapped[13] = swapped[13], swapped[12]
        with self.assertRaises(ProbeError) as refused:
            piece_scales(k, (768, 320), (256, 320), swapped)
        self.assertIn("puts 'k_proj.weight_scale_inv' element [1, 1] where the scale of block [1, 0] belongs",
                      str(refused.exception))

    def test_client_namespaces_rename_block_scale_buffers_too(self):
        layout = tensor_layout("w", (2, 8), "float8_e4m3", placements=[((0, 0), (2, 8), "weights", 0)],
                               block_scales=[("scales", 0)])
        buffers, (renamed,) = namespaced({"weights": None, "scales": None}, [layout], "rollout-0")
        self.assertEqual(set(buffers), {"rollout-0/weights", "rollout-0/scales"})
        self.assertEqual(renamed.placements[0].buffer, "rollout-0/weights")
        self.assertEqual(renamed.block_scales[0].buffer, "rollout-0/scales")

    def test_a_plain_module_trainer_into_a_module_engine(self):
        """A whole module on rank 0 (a plain trainer) into a whole module on rank 1 (a
        Hugging Face model as the rollout), with fused MoE experts on the engine side as
        transformers 5 stores them."""
        shapes = vllm_qwen3.checkpoint_shapes(MOE)
        checkpoint = random_checkpoint(shapes, 4)
        trainer = CheckpointModule(shapes)
        for name, param in trainer.named_parameters():
            param.data.copy_(checkpoint[name])
        self.handles.append(TrainerSource(self.agent(0), "trainer-0", lambda: module_sources(trainer)))
        fused = {}
        for name, shape in shapes.items():
            stem, _, rest = name.partition(".mlp.experts.")
            if not rest:
                fused[name] = shape
            elif rest.startswith("0.gate_proj"):
                fused[stem + ".mlp.experts.gate_up_proj"] = (MOE.num_experts, 2 * shape[0], shape[1])
            elif rest.startswith("0.down_proj"):
                fused[stem + ".mlp.experts.down_proj"] = (MOE.num_experts,) + shape
        engine = CheckpointModule(fused)
        for param in engine.parameters():
            param.data.fill_(float("nan"))
        self.handles.append(EngineTarget(self.agent(1), "rollout-1", lambda: module_targets(engine)))
        self.sync()
        for name, param in engine.named_parameters():
            expected = torch.cat([checkpoint[s.name].reshape(-1) for s in segments(name, param.shape)])
            self.assertTrue(torch.equal(param.data.reshape(-1).view(torch.int16), expected.view(torch.int16)), name)

    def test_a_loader_that_changes_values_is_refused_naming_the_parameter(self):
        shapes = vllm_qwen3.checkpoint_shapes(DENSE)
        engine = vllm_qwen3.Qwen3ForCausalLM(DENSE)

        def scaled(weights):
            engine.load_weights((name, t * 2 if name.endswith("o_proj.weight") else t) for name, t in weights)

        with self.assertRaises(ProbeError) as refused:
            loader_targets(engine, scaled, shapes)
        self.assertIn("o_proj", str(refused.exception))
        for param in engine.parameters():
            self.assertEqual(param.dtype, torch.bfloat16)  # every parameter got its memory back


def rebuild(result, param_shapes, checkpoint):
    """Each parameter as a probe's pieces and fills say it is filled from `checkpoint`."""
    out = {name: torch.full(shape, float("nan"), dtype=torch.float64) for name, shape in param_shapes.items()}
    for piece in result.pieces:
        box = checkpoint[piece.tensor][tuple(slice(lo, hi) for lo, hi in zip(piece.lo, piece.hi))]
        torch.as_strided(out[piece.param].view(-1), box.shape, piece.strides, piece.base).copy_(box)
    for fill in result.fills:
        torch.as_strided(out[fill.param].view(-1), fill.shape, fill.strides, fill.base).fill_(0)
    return out


class TensorBufferTest(unittest.TestCase):
    """A CPU tensor's buffer under each torch sharing strategy, read back through what
    the agent would open: the bytes there are the tensor's own, and its views follow."""

    def tearDown(self):
        torch.multiprocessing.set_sharing_strategy("file_descriptor")

    @staticmethod
    def tensor():
        whole = torch.randn(1000, dtype=torch.float32)
        return whole, whole[100:700]  # a view at an offset into its storage

    def test_under_file_descriptor_the_storage_descriptor_is_passed(self):
        torch.multiprocessing.set_sharing_strategy("file_descriptor")
        whole, view = self.tensor()
        buffer = tensor_buffer(view)
        self.assertIsInstance(buffer, DescriptorBuffer)
        self.assertEqual(buffer.nbytes, 600 * 4)
        self.assertEqual(os.pread(buffer.fd, buffer.nbytes, buffer.offset_bytes), view.numpy().tobytes())
        view[7] = 3.5  # the tensor's memory is the shared memory now
        self.assertEqual(os.pread(buffer.fd, 4, buffer.offset_bytes + 28), torch.tensor([3.5]).numpy().tobytes())

    def test_under_file_system_the_agent_opens_it_by_name(self):
        torch.multiprocessing.set_sharing_strategy("file_system")
        whole, view = self.tensor()
        handle, nbytes = tensor_buffer(view)
        self.assertEqual(nbytes, 600 * 4)
        with open("/dev/shm" + handle.shm_name, "rb") as shm:
            shm.seek(handle.offset_bytes)
            self.assertEqual(shm.read(nbytes), view.numpy().tobytes())

    def test_a_tensor_neither_on_cuda_nor_on_the_cpu_is_refused_naming_its_device(self):
        with self.assertRaisesRegex(ValueError, "not one on 'meta'"):
            tensor_buffer(torch.empty(4, device="meta"))

    def test_a_storage_shared_under_the_other_strategy_moves_and_its_views_follow(self):
        torch.multiprocessing.set_sharing_strategy("file_system")
        whole, view = self.tensor()
        whole.share_memory_()
        torch.multiprocessing.set_sharing_strategy("file_descriptor")
        buffer = tensor_buffer(view)
        view[3] = 7.0
        self.assertEqual(os.pread(buffer.fd, buffer.nbytes, buffer.offset_bytes), view.numpy().tobytes())


class ProbeTest(unittest.TestCase):
    """The probe's pieces against the loader itself: each parameter rebuilt from the
    pieces must equal what the loader writes from the same checkpoint."""

    LOADERS = {  # parameter shape, checkpoint shapes, how the loader fills the parameter
        "a 3-D copy": ((2, 3, 4), {"a": (2, 3, 4)}, lambda p, c: p.copy_(c["a"])),
        "a slice of a 3-D tensor": ((2, 2, 4), {"a": (3, 3, 4)}, lambda p, c: p.copy_(c["a"][1:, 1:])),
        "a transpose": ((4, 3), {"a": (3, 4)}, lambda p, c: p.copy_(c["a"].t())),
        "fused rows with padding": ((7, 4), {"q": (4, 4), "k": (2, 4)},
                                    lambda p, c: (p[:2].copy_(c["q"][2:]), p[2:4].copy_(c["k"]), p[4:].fill_(0))),
        "a column slice": ((3, 2), {"a": (3, 5)}, lambda p, c: p.copy_(c["a"][:, 3:])),
        "every other row": ((2, 3), {"a": (4, 3)}, lambda p, c: p.copy_(c["a"][::2])),
        "a 1-D tensor inside a 2-D parameter": ((2, 3), {"b": (6,)}, lambda p, c: p.view(-1).copy_(c["b"])),
    }

    def test_a_loader_that_replaces_a_parameter_is_refused_and_the_model_restored(self):
        """Some engines' post-load steps assign a new Parameter instead of writing into the
        old one: the probe cannot see where that one's elements go."""
        class Replacing(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.w = torch.nn.Parameter(torch.zeros(4, dtype=torch.bfloat16))
                self.b = torch.nn.Parameter(torch.zeros(3, dtype=torch.bfloat16))

            def load_weights(self, weights):
                for name, tensor in weights:
                    if name == "w":
                        self.w = torch.nn.Parameter(tensor.clone())
                    else:
                        self.b.data.copy_(tensor)

        model = Replacing()
        w, b = model.w, model.b
        with self.assertRaisesRegex(ProbeError, "the loader replaces parameter\\(s\\) 'w' with new tensors"):
            loader_targets(model, model.load_weights, {"w": (4,), "b": (3,)})
        self.assertIs(model.w, w)
        self.assertIs(model.b, b)
        self.assertEqual([p.dtype for p in model.parameters()], [torch.bfloat16, torch.bfloat16])

    def test_the_pieces_rebuild_what_the_loader_writes(self):
        """Also read an element, and a few rows, at a time: the same pieces."""
        from shardsync.integrations import probe
        for chunk, (case, (shape, shapes, fill)) in itertools.product((1, 5, probe.CHUNK_ELEMENTS),
                                                                      self.LOADERS.items()):
            with self.subTest(case, chunk=chunk), mock.patch.object(probe, "CHUNK_ELEMENTS", chunk):
                param = torch.nn.Parameter(torch.empty(shape))
                result = probe.probe({"p": param}, shapes, lambda weights: fill(param.data, dict(weights)))
                generator = torch.Generator().manual_seed(1)
                checkpoint = {n: torch.randn(s, generator=generator, dtype=torch.float64) for n, s in shapes.items()}
                expected = torch.empty(shape, dtype=torch.float64)
                fill(expected, checkpoint)
                self.assertTrue(torch.equal(rebuild(result, {"p": shape}, checkpoint)["p"], expected),
                                f"{case}: {result}")

    def test_the_probe_holds_a_checkpoint_tensor_and_a_few_rows_beside_the_parameters(self):
        """Beside the parameters' float64 probes (torch's memory) the probe's own arrays
        hold one checkpoint tensor's codes and a bounded stretch of rows, whatever the
        parameters' size: numpy's allocations, as tracemalloc counts them."""
        import tracemalloc
        from shardsync.integrations import probe
        self.enterContext(mock.patch.object(probe, "CHUNK_ELEMENTS", 4096))
        shape = (1024, 1024)
        param = torch.nn.Parameter(torch.empty(shape))
        tracemalloc.start()
        self.addCleanup(tracemalloc.stop)
        result = probe.probe({"p": param}, {"a": shape}, lambda weights: [param.data.copy_(t) for _, t in weights])
        peak = tracemalloc.get_traced_memory()[1]
        codes = 8 * shape[0] * shape[1]
        self.assertLess(peak, codes + (1 << 20), f"{peak} bytes at the peak for a checkpoint of {codes} bytes")
        self.assertEqual([(p.tensor, p.lo, p.hi, p.base, p.strides) for p in result.pieces],
                         [("a", (0, 0), shape, 0, (1024, 1))])

    def test_probes_in_files_give_the_same_pieces_and_leave_no_file(self):
        """The probes and the codes kept in files of a folder on disk, a file each: the
        same layouts as in memory, for every rank of the stand-in, and the folder empty
        after each probe, also after a loader that fails."""
        from shardsync.integrations import probe
        folder = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
        shapes = vllm_qwen3.checkpoint_shapes(DENSE)
        for tp, rank in ((1, 0), (2, 0), (2, 1)):
            with self.subTest(tp=tp, rank=rank):
                engine = vllm_qwen3.Qwen3ForCausalLM(DENSE, tp_rank=rank, tp_size=tp)
                in_memory = loader_targets(engine, engine.load_weights, shapes)[1]
                engine = vllm_qwen3.Qwen3ForCausalLM(DENSE, tp_rank=rank, tp_size=tp)  # probed afresh
                with mock.patch.object(probe.tempfile, "mkstemp", wraps=tempfile.mkstemp) as made:
                    in_files = loader_targets(engine, engine.load_weights, shapes, probe_dir=folder)[1]
                self.assertEqual(made.call_count, sum(p.numel() > 0 for p in engine.parameters()) +
                                 sum(math.prod(shape) > 0 for shape in shapes.values()))
                self.assertTrue(all(call.kwargs["dir"] == folder for call in made.call_args_list))
                self.assertEqual([layout.SerializeToString(deterministic=True) for layout in in_files],
                                 [layout.SerializeToString(deterministic=True) for layout in in_memory])
                self.assertEqual(os.listdir(folder), [])
        engine = vllm_qwen3.Qwen3ForCausalLM(DENSE)

        def failing(weights):
            engine.load_weights(weights)
            raise RuntimeError("the loader fails")

        with self.assertRaisesRegex(RuntimeError, "the loader fails"):
            loader_targets(engine, failing, shapes, probe_dir=folder)
        self.assertEqual(os.listdir(folder), [])
        self.assertTrue(all(p.dtype == torch.bfloat16 for p in engine.parameters()))

    def test_registering_again_after_the_memory_moved_runs_no_loader(self):
        """The probe's result is kept per model: after every parameter's memory moved,
        loader_targets gives the same layouts and buffers of the new memory without
        running the loader; a parameter of another dtype, or another loader, runs it."""
        from shardsync.integrations import targets
        shapes = vllm_qwen3.checkpoint_shapes(DENSE)
        engine = vllm_qwen3.Qwen3ForCausalLM(DENSE, tp_rank=1, tp_size=2)
        self.enterContext(mock.patch.object(targets, "probe", wraps=targets.probe))
        first = loader_targets(engine, engine.load_weights, shapes)[1]
        for param in engine.parameters():
            param.data = param.data.clone()
        with mock.patch.object(targets, "tensor_buffer", wraps=targets.tensor_buffer) as shared:
            again = loader_targets(engine, engine.load_weights, shapes)[1]
        self.assertEqual(targets.probe.call_count, 1)
        self.assertEqual([layout.SerializeToString(deterministic=True) for layout in again],
                         [layout.SerializeToString(deterministic=True) for layout in first])
        self.assertEqual({call.args[0].data_ptr() for call in shared.call_args_list},
                         {p.data_ptr() for p in engine.parameters()})
        engine.model.norm.weight.data = engine.model.norm.weight.data.float()
        loader_targets(engine, engine.load_weights, shapes)
        self.assertEqual(targets.probe.call_count, 2)
        loader_targets(engine, lambda weights: engine.load_weights(weights), shapes)
        self.assertEqual(targets.probe.call_count, 3)

    def test_a_probe_dir_in_memory_or_missing_is_refused_by_name(self):
        from shardsync.integrations import probe
        with open("/proc/self/mountinfo") as mounts:  # /dev/shm on every Linux this runs on
            tmpfs = [line.split()[4] for line in mounts if " - tmpfs " in line]
        self.assertTrue(tmpfs, "no tmpfs mount on this machine")
        param = torch.nn.Parameter(torch.zeros(2, 3))
        with self.assertRaisesRegex(ProbeError, f"probe_dir '{tmpfs[0]}' is on tmpfs"):
            probe.probe({"p": param}, {"a": (2, 3)}, lambda weights: None, probe_dir=tmpfs[0])
        missing = os.path.join(tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR")), "absent")
        with self.assertRaisesRegex(ProbeError, f"probe_dir '{missing}' is no folder"):
            probe.probe({"p": param}, {"a": (2, 3)}, lambda weights: None, probe_dir=missing)
        self.assertEqual(param.dtype, torch.float32)

    def test_a_probe_dir_without_room_is_refused_before_a_write_could_fault(self):
        """Each probe file's blocks are allocated before it is mapped: a full disk is an
        error naming the folder (a write into a mapping the disk cannot hold is SIGBUS),
        and the parameters and the folder are as before."""
        import errno
        from shardsync.integrations import probe
        folder = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
        param = torch.nn.Parameter(torch.zeros(2, 3))
        full = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        with mock.patch.object(probe.os, "posix_fallocate", side_effect=full), self.assertRaisesRegex(
                ProbeError, f"probe_dir '{folder}' has no room for a probe of 48 bytes: No space left on device"):
            probe.probe({"p": param}, {"a": (2, 3)}, lambda weights: None, probe_dir=folder)
        self.assertEqual(os.listdir(folder), [])
        self.assertEqual(param.dtype, torch.float32)

    def test_a_value_that_is_no_code_is_refused_naming_its_element(self):
        """Not whole, not finite, negative, past the last code, or failing its check."""
        from shardsync.integrations import probe
        self.enterContext(mock.patch.object(probe, "CHUNK_ELEMENTS", 16))
        param = torch.nn.Parameter(torch.empty(10, 8))
        for change in (lambda v: v + 0.5, lambda v: math.nan, lambda v: -math.inf, lambda v: -v,
                       lambda v: v * 2 ** 20, lambda v: v + 1):
            def load(weights):
                for _, tensor in weights:
                    param.data.copy_(tensor)
                    param.data[7, 3] = change(param.data[7, 3].item())  # element 59, in the fourth block

            with self.subTest(wrote=change(2.0)), self.assertRaisesRegex(
                    ProbeError, "the loader of parameter 'p' wrote .* at element 59, which is no checkpoint "
                    "element's code"):
                probe.probe({"p": param}, {"a": (10, 8)}, load)

    def test_a_loader_that_writes_a_buffer_is_refused_and_the_buffer_kept(self):
        from shardsync.integrations import probe
        norm = torch.nn.BatchNorm1d(3)
        before = norm.running_mean.clone()

        def load(weights):
            for name, tensor in weights:
                getattr(norm, name).data.copy_(tensor)

        with self.assertRaises(ProbeError) as refused:
            probe.probe(dict(norm.named_parameters()), {"weight": (3,), "running_mean": (3,)}, load,
                        dict(norm.named_buffers()))
        self.assertIn("running_mean", str(refused.exception))
        self.assertTrue(torch.equal(norm.running_mean, before))


def two_layers():
    """Parameters 'layers.0.w' and 'layers.1.w' (4 x 3) and 'head' (2 x 3), zeros."""
    model = torch.nn.Module()
    model.layers = torch.nn.ModuleList()
    for _ in range(2):
        layer = torch.nn.Module()
        layer.w = torch.nn.Parameter(torch.zeros(4, 3))
        model.layers.append(layer)
    model.head = torch.nn.Parameter(torch.zeros(2, 3))
    return model


class ProbeByLayerTest(unittest.TestCase):
    """The loader run once per layer, with only that layer's parameters probed."""

    SHAPES = {"layers.0.w": (4, 3), "layers.1.w": (4, 3), "head": (2, 3)}

    def test_a_layer_is_a_component_and_its_number(self):
        from shardsync.integrations.probe import layer_of
        self.assertEqual(layer_of("model.layers.5.mlp.experts.17.gate_proj.weight"), "layers.5")
        self.assertEqual(layer_of("language_model.model.layers.12.self_attn.q_proj.weight"), "layers.12")
        self.assertEqual(layer_of("h.0.attn.c_attn.weight"), "h.0")
        self.assertEqual(layer_of("model.embed_tokens.weight"), "")
        self.assertEqual(layer_of("lm_head.weight"), "")
        self.assertEqual(layer_of("model.layers5.w"), "")

    def test_the_same_result_as_one_pass_with_one_layers_probes_at_a_time(self):
        """Every stand-in (dense, tied, MoE), every rank at TP 1 and 2: the same pieces,
        fills and unreached parameters as with every parameter probed at once; the loader
        ran once per layer and once for the rest, and while it ran the parameters of
        the layer it was given were probes and every other one a trap (strides of 0)."""
        from shardsync.integrations import probe
        for config, (tp, rank) in itertools.product((DENSE, TIED, MOE), ((1, 0), (2, 0), (2, 1))):
            with self.subTest(config=config, tp=tp, rank=rank):
                engine = vllm_qwen3.Qwen3ForCausalLM(config, tp_rank=rank, tp_size=tp)
                shapes = vllm_qwen3.checkpoint_shapes(config)
                params = dict(engine.named_parameters())
                calls = []

                def load(weights):
                    weights = list(weights)
                    probed = {n for n, p in params.items() if any(p.data.stride())}
                    calls.append(({probe.layer_of(n) for n, _ in weights}, {probe.layer_of(n) for n in probed},
                                  probed))
                    engine.load_weights(weights)

                by_layer = probe.probe(params, shapes, load, dict(engine.named_buffers()))
                one_pass = probe.probe(params, shapes, engine.load_weights, dict(engine.named_buffers()),
                                       by_layer=False)
                layers = {probe.layer_of(n) for n in shapes}
                self.assertEqual((by_layer.passes, by_layer.one_pass_because), (config.num_hidden_layers + 1, None))
                self.assertEqual(len(calls), len(layers))
                for given, probed_layers, probed in calls:
                    self.assertEqual(len(given), 1)
                    self.assertEqual(probed_layers, given)
                    self.assertEqual(probed, {n for n in params if probe.layer_of(n) in given})
                self.assertEqual(by_layer.pieces, one_pass.pieces)
                self.assertEqual(by_layer.fills, one_pass.fills)
                self.assertEqual(by_layer.unreached, one_pass.unreached)
                self.assertTrue(all(p.dtype == torch.bfloat16 and any(p.stride()) for p in engine.parameters()))

    def test_a_loader_that_crosses_layers_is_probed_in_one_pass_saying_why(self):
        """Where the loader writes or reads another layer's parameter, or cannot run on
        one layer's tensors alone, the probe runs again with every parameter probed: the
        result is what the loader does (rebuilt from random data), the reason is named and
        logged, and the parameters are back."""
        from shardsync.integrations import probe

        def copy_own(params, name, tensor):
            params[name].data.copy_(tensor)

        def writes_many(params, name, tensor):
            copy_own(params, name, tensor)
            if name == "layers.1.w":
                params["layers.0.w"].data[0].copy_(tensor[0])

        def writes_one(params, name, tensor):
            copy_own(params, name, tensor)
            if name == "layers.1.w":
                params["layers.0.w"].data[0, 0] = tensor[0, 0]

        def reads(params, name, tensor):
            copy_own(params, name, tensor)
            if name == "layers.1.w":
                params["layers.1.w"].data[2:].copy_(params["layers.0.w"].data[:2])

        def replaces(params, name, tensor):
            copy_own(params, name, tensor)
            if name == "layers.1.w":
                params["layers.0.w"].data = params["layers.0.w"].data.clone()

        cases = {
            "writes rows": (writes_many, "the loader failed given layer 'layers.1' alone \\(RuntimeError: "
                            "unsupported operation"),
            "writes one element": (writes_one, "the loader wrote parameter 'layers.0.w' given layer 'layers.1'$"),
            "reads": (reads, "the loader put a value into parameter 'layers.1.w' that it read from a parameter "
                      "of another layer"),
            "replaces data": (replaces, "the loader wrote parameter 'layers.0.w' given layer 'layers.1'$"),
        }
        for case, (write, why) in cases.items():
            with self.subTest(case):
                model = two_layers()
                params = dict(model.named_parameters())

                def load(weights):
                    for name, tensor in weights:
                        write(params, name, tensor)

                with self.assertLogs("shardsync.integrations.probe", "WARNING") as logged:
                    result = probe.probe(params, self.SHAPES, load)
                self.assertEqual(result.passes, 1)
                self.assertRegex(result.one_pass_because, why)
                self.assertIn(result.one_pass_because, logged.output[0])
                self.assertEqual(result.pieces, probe.probe(params, self.SHAPES, load, by_layer=False).pieces)
                self.assertTrue(all(p.dtype == torch.float32 and not p.any() for p in model.parameters()))
                generator = torch.Generator().manual_seed(2)
                checkpoint = {n: torch.randn(s, generator=generator, dtype=torch.float64)
                              for n, s in self.SHAPES.items()}
                expected = {n: torch.zeros(s, dtype=torch.float64) for n, s in self.SHAPES.items()}
                holders = {n: SimpleNamespace(data=t) for n, t in expected.items()}
                for name, tensor in checkpoint.items():
                    write(holders, name, tensor)
                rebuilt = rebuild(result, self.SHAPES, checkpoint)
                for name in self.SHAPES:
                    self.assertTrue(torch.equal(rebuilt[name], holders[name].data), f"{case}: {name}")

    def test_a_loader_that_needs_every_tensor_at_once_is_probed_in_one_pass(self):
        from shardsync.integrations import probe
        model = two_layers()
        params = dict(model.named_parameters())

        def load(weights):
            weights = dict(weights)
            if len(weights) != len(self.SHAPES):
                raise ValueError(f"{len(weights)} tensors given")
            for name, tensor in weights.items():
                params[name].data.copy_(tensor)

        with self.assertLogs("shardsync.integrations.probe", "WARNING"):
            result = probe.probe(params, self.SHAPES, load)
        self.assertEqual(result.one_pass_because,
                         "the loader failed given layer 'layers.0' alone (ValueError: 1 tensors given)")
        self.assertEqual(sorted(p.tensor for p in result.pieces), sorted(self.SHAPES))

    def test_a_value_that_is_no_code_is_refused_by_layer_without_a_second_run(self):
        from shardsync.integrations import probe
        model = two_layers()
        params = dict(model.named_parameters())
        given = []

        def load(weights):
            for name, tensor in weights:
                given.append(name)
                params[name].data.copy_(tensor + (0.5 if name == "layers.1.w" else 0))

        with self.assertRaisesRegex(ProbeError, "the loader of parameter 'layers.1.w' wrote .* at element 0, which "
                                    "is no checkpoint element's code"):
            probe.probe(params, self.SHAPES, load)
        self.assertEqual(given, ["layers.0.w", "layers.1.w"])
        self.assertTrue(all(p.dtype == torch.float32 for p in model.parameters()))

    def test_the_memory_of_one_layers_probes(self):
        """Peak resident memory added by the probe of 8 layers of 16 MiB of probes each,
        in fresh processes: all 8 at once in one pass, about one by layer."""
        script = """if True:
            import resource, sys, torch
            from shardsync.integrations import probe
            model = torch.nn.Module()
            model.layers = torch.nn.ModuleList(torch.nn.Linear(1024, 2048, bias=False) for _ in range(8))
            params = dict(model.named_parameters())
            shapes = {n: tuple(p.shape) for n, p in params.items()}
            def load(weights):
                for name, tensor in weights:
                    params[name].data.copy_(tensor)
            before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            result = probe.probe(params, shapes, load, by_layer=sys.argv[1] == "by_layer")
            assert len(result.pieces) == 8, result
            print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024)
            """
        added = {}
        for way in ("by_layer", "one_pass"):
            out = subprocess.run([sys.executable, "-c", script, way], capture_output=True, text=True)
            self.assertEqual(out.returncode, 0, out.stderr)
            added[way] = int(out.stdout)
        probes = 8 * 2048 * 1024 * 8
        self.assertGreater(added["one_pass"], probes, added)
        self.assertLess(added["by_layer"], added["one_pass"] / 2, added)


class NamesTest(unittest.TestCase):
    def test_wrapper_components_leave_checkpoint_names(self):
        self.assertEqual(checkpoint_name("module._orig_mod.model.layers.0._checkpoint_wrapped_module.mlp.weight"),
                         "model.layers.0.mlp.weight")
        self.assertEqual(checkpoint_name("model.norm.weight", rename=lambda n: "x." + n), "x.model.norm.weight")

    def test_fused_experts_are_each_experts_checkpoint_tensors_in_order(self):
        parts = segments("model.layers.3.mlp.experts.gate_up_proj", (2, 6, 5))
        self.assertEqual([(s.name, s.shape, s.offset) for s in parts], [
            ("model.layers.3.mlp.experts.0.gate_proj.weight", (3, 5), 0),
            ("model.layers.3.mlp.experts.0.up_proj.weight", (3, 5), 15),
            ("model.layers.3.mlp.experts.1.gate_proj.weight", (3, 5), 30),
            ("model.layers.3.mlp.experts.1.up_proj.weight", (3, 5), 45)])
        self.assertEqual(segments("model.norm.weight", (5,))[0].offset, 0)

    def test_safetensors_headers_give_the_shapes(self):
        import json
        import struct
        folder = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
        header = json.dumps({"a.weight": {"dtype": "BF16", "shape": [2, 3], "data_offsets": [0, 12]},
                             "__metadata__": {"format": "pt"}}).encode()
        with open(os.path.join(folder, "model.safetensors"), "wb") as f:
            f.write(struct.pack("<Q", len(header)) + header + bytes(12))
        self.assertEqual(safetensors_shapes(folder), {"a.weight": (2, 3)})


if __name__ == "__main__":
    result = unittest.main(exit=False, verbosity=2).result
    failed = len(result.failures) + len(result.errors)
    print(f"{result.testsRun - failed} passed, {failed} failed")
    sys.exit(1 if failed or result.testsRun == 0 else 0)
