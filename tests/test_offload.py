"""toolkit.offload: an optimizer whose states live in host memory or a memory-mapped file gives
the in-memory optimizer's parameters bit for bit, moves exactly the predicted bytes per step,
holds no state on the device, and leaves no file behind; on 2-3 ranks under ZeRO-2 each rank
offloads its shard and trains like the in-memory sharded optimizer."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from toolkit.cost.offload import step_bytes
from toolkit.launch import gpu_count
from toolkit.experiments.offload import BATCH, run_sharded, time_steps
from toolkit.memory import held_model_states, shard_numel
from toolkit.models import TinyMLP, count_parameters, make_regression_data
from toolkit.offload import (
    MASTER, FileStore, HostStore, OffloadOptimizer, ThrottledStore, make_store,
)

MLP = dict(d_in=8, d_hidden=33, d_out=5, depth=2)  # 33 and 5: no size divides the chunks
CASES = [(torch.optim.Adam, dict(lr=1e-2), 8), (torch.optim.AdamW, dict(lr=1e-2), 8),
         (torch.optim.SGD, dict(lr=0.1, momentum=0.9), 4), (torch.optim.SGD, dict(lr=0.1), 0)]
"""(optimizer, options, bytes of state per element it keeps)."""


def offload_leftovers() -> set[str]:
    return {p.name for p in Path(tempfile.gettempdir()).iterdir()
            if p.name.startswith("offload-")}


@pytest.fixture(autouse=True)
def no_files_left(tmp_path, monkeypatch):
    """Every test leaves the temporary folder as it found it. The folder is the test's own
    (tempfile's default and TMPDIR, which ranks inherit): another pytest-xdist worker's offload
    folders, made and removed meanwhile in the machine's /tmp, are not this test's."""
    private = tmp_path / "tmp"
    private.mkdir()
    monkeypatch.setenv("TMPDIR", str(private))
    monkeypatch.setattr(tempfile, "tempdir", str(private))
    yield
    assert offload_leftovers() == set()


def train(model, opt, steps, x, y):
    for _ in range(steps):
        opt.zero_grad()
        F.mse_loss(model(x), y).backward()
        opt.step()
        yield opt


# Adam in every (tier, prefetch); the others where their state layout differs from Adam's, not
# in every combination again (the suite's time budget): AdamW and both SGDs through the file
# with prefetch, SGD with momentum also from host memory without.
MATRIX = ([(tier, prefetch, CASES[0]) for tier in ("cpu", "nvme") for prefetch in (False, True)]
          + [("nvme", True, case) for case in CASES[1:]] + [("cpu", False, CASES[2])])


@pytest.mark.parametrize("tier, prefetch, case", MATRIX,
                         ids=[f"{c[0].__name__}{len(c[1])}-{t}-{'prefetch' if p else 'serial'}"
                              for t, p, c in MATRIX])
def test_equal_to_in_memory_bit_for_bit_and_bytes_exact(tier, prefetch, case):
    optimizer, options, state_bytes = case
    x, y = make_regression_data(16, MLP["d_in"], MLP["d_out"])
    model, ref = TinyMLP(**MLP), TinyMLP(**MLP)
    psi = count_parameters(model)
    ref_opt = optimizer(ref.parameters(), **options)
    with OffloadOptimizer(model.parameters(), optimizer, tier=tier, chunk_numel=101,
                          prefetch=prefetch, **options) as opt:
        for step, _ in enumerate(train(model, opt, 4, x, y)):
            ref_opt.zero_grad()
            F.mse_loss(ref(x), y).backward()
            ref_opt.step()
            assert all(torch.equal(a, b) for a, b in zip(model.parameters(), ref.parameters()))
            # Exactly s·Ψ each way; the first step reads nothing (the states are made then).
            want = step_bytes(psi, state_bytes=state_bytes, first=step == 0)
            assert (opt.last_step.bytes_read, opt.last_step.bytes_written) == want
            assert opt.last_step.chunks == len(opt.chunks) > psi // 101
        assert opt.store.nbytes == state_bytes * psi
        # One state tensor of one chunk at a time: 101 elements of 4 bytes at most.
        assert opt.store.largest_transfer == (101 * 4 if state_bytes else 0)
        # The device keeps no optimizer state: only its chunk buffers, two with prefetch.
        assert held_model_states(model, opt).optimizer == 0
        assert opt.device_bytes == (2 if prefetch else 1) * 101 * state_bytes
        state = opt.state_dict()["state"]
        torch.testing.assert_close(state, ref_opt.state_dict()["state"], rtol=0, atol=0)


def test_chunks_never_span_parameters_and_cover_each_once():
    model = TinyMLP(**MLP)
    with OffloadOptimizer(model.parameters(), torch.optim.Adam, tier="cpu",
                          chunk_numel=100) as opt:
        for p in model.parameters():
            mine = [c for c in opt.chunks if c.param is p]
            assert [(c.lo, c.hi) for c in mine] == [
                (lo, min(lo + 100, p.numel())) for lo in range(0, p.numel(), 100)]
        offsets = [c.offset for c in opt.chunks]
        assert offsets == sorted(offsets) and opt.numel == count_parameters(model)


def test_frozen_and_unused_parameters_move_nothing():
    model, ref = TinyMLP(**MLP), TinyMLP(**MLP)
    for m in (model, ref):
        m.layers[0].bias.requires_grad_(False)  # frozen: not offloaded at all
    x, y = make_regression_data(16, MLP["d_in"], MLP["d_out"])
    ref_opt = torch.optim.Adam([p for p in ref.parameters() if p.requires_grad], lr=1e-2)
    with OffloadOptimizer([p for p in model.parameters() if p.requires_grad], torch.optim.Adam,
                          tier="nvme", chunk_numel=50, lr=1e-2) as opt:
        trainable = count_parameters(model, trainable_only=True)
        assert opt.numel == trainable
        skipped = model.layers[-1].weight
        moved = []
        for step in range(3):
            for m, o in ((model, opt), (ref, ref_opt)):
                o.zero_grad()
                F.mse_loss(m(x), y).backward()
                if step == 1:  # the last layer's weight gets no gradient this step
                    m.layers[-1].weight.grad = None
                o.step()
            assert all(torch.equal(a, b) for a, b in zip(model.parameters(), ref.parameters()))
            moved.append(opt.last_step.bytes_read)
        # Step 1 skips the weight's chunks (no read, no update), as torch skips the parameter.
        assert moved == [0, 8 * (trainable - skipped.numel()), 8 * trainable]


def test_master_weights_keep_fp32_off_the_device_and_match_mixed_precision():
    x, y = (t.bfloat16() for t in make_regression_data(16, MLP["d_in"], MLP["d_out"]))
    model, ref = TinyMLP(**MLP).bfloat16(), TinyMLP(**MLP).bfloat16()
    psi = count_parameters(model)
    # The in-memory reference: fp32 masters stepped by Adam, copied into the bf16 model.
    masters = [nn.Parameter(p.detach().float().clone()) for p in ref.parameters()]
    ref_opt = torch.optim.Adam(masters, lr=1e-2)
    with OffloadOptimizer(model.parameters(), torch.optim.Adam, tier="nvme", chunk_numel=64,
                          master_weights=True, lr=1e-2) as opt:
        for step, _ in enumerate(train(model, opt, 3, x, y)):
            for p in ref.parameters():
                p.grad = None
            F.mse_loss(ref(x), y).backward()
            for m, p in zip(masters, ref.parameters()):
                m.grad = p.grad.float()
            ref_opt.step()
            with torch.no_grad():
                for m, p in zip(masters, ref.parameters()):
                    p.copy_(m)
            assert all(torch.equal(a, b) for a, b in zip(model.parameters(), ref.parameters()))
            # fp32 master (4) + momentum (4) + variance (4): ZeRO's K = 12, each way.
            want = step_bytes(psi, state_bytes=8, master_bytes=4, first=step == 0)
            assert (opt.last_step.bytes_read, opt.last_step.bytes_written) == want
        assert opt.store.nbytes == 12 * psi and MASTER in opt.layout
        state = opt.state_dict()["state"]
        for i, m in enumerate(masters):
            assert torch.equal(state[i][MASTER], m)
        assert all(p.dtype == torch.bfloat16 for p in model.parameters())


def test_state_dict_loads_both_ways():
    x, y = make_regression_data(16, MLP["d_in"], MLP["d_out"])
    model, ref = TinyMLP(**MLP), TinyMLP(**MLP)
    ref_opt = torch.optim.Adam(ref.parameters(), lr=1e-2)
    for _ in range(2):  # two in-memory steps, then the offloaded optimizer takes over
        for m in (model, ref):
            m.zero_grad()
            F.mse_loss(m(x), y).backward()
        ref_opt.step()
    model.load_state_dict(ref.state_dict())
    with OffloadOptimizer(model.parameters(), torch.optim.Adam, tier="nvme", chunk_numel=40,
                          lr=1e-2) as opt:
        opt.load_state_dict(ref_opt.state_dict())
        for _ in train(model, opt, 2, x, y):
            ref_opt.zero_grad()
            F.mse_loss(ref(x), y).backward()
            ref_opt.step()
            assert opt.last_step.bytes_read == 8 * count_parameters(model)  # states were there
        assert all(torch.equal(a, b) for a, b in zip(model.parameters(), ref.parameters()))
        back = torch.optim.Adam(TinyMLP(**MLP).parameters(), lr=1e-2)
        back.load_state_dict(opt.state_dict())  # and back into torch's own Adam
        torch.testing.assert_close(back.state_dict(), ref_opt.state_dict(), rtol=0, atol=0)


def test_file_store_files_hold_the_states_and_go_away():
    model = TinyMLP(**MLP)
    psi = count_parameters(model)
    x, y = make_regression_data(16, MLP["d_in"], MLP["d_out"])
    with tempfile.TemporaryDirectory() as parent:
        opt = OffloadOptimizer(model.parameters(), torch.optim.Adam, folder=parent, lr=1e-2)
        list(train(model, opt, 2, x, y))
        assert opt.store.file_bytes() == {"exp_avg": 4 * psi, "exp_avg_sq": 4 * psi}
        folder = opt.store.folder
        assert sorted(os.listdir(folder)) == ["exp_avg.bin", "exp_avg_sq.bin"]
        opt.close()
        assert not os.path.exists(folder) and os.listdir(parent) == []


def test_file_store_close_removes_its_default_folder():
    store = FileStore()
    store.allocate("x", 10, torch.float32)
    folder = store.folder
    assert os.path.exists(folder)
    store.close()
    assert not os.path.exists(folder)


@pytest.mark.parametrize("store", ["cold", "throttled"])
def test_cold_and_throttled_stores_change_speed_not_results(store):
    x, y = make_regression_data(16, MLP["d_in"], MLP["d_out"])
    model, ref = TinyMLP(**MLP), TinyMLP(**MLP)
    ref_opt = torch.optim.Adam(ref.parameters(), lr=1e-2)
    tier = (FileStore(cold=True) if store == "cold" else
            ThrottledStore(make_store("nvme"), latency=1e-4, bandwidth=1e9))
    with OffloadOptimizer(model.parameters(), torch.optim.Adam, store=tier, chunk_numel=300,
                          lr=1e-2) as opt:
        for _ in train(model, opt, 3, x, y):
            ref_opt.zero_grad()
            F.mse_loss(ref(x), y).backward()
            ref_opt.step()
        assert opt.last_step.bytes_read == opt.last_step.bytes_written == 8 * opt.numel
        assert all(torch.equal(a, b) for a, b in zip(model.parameters(), ref.parameters()))


@pytest.mark.parametrize("prefetch", [False, True])
def test_spans_cover_each_chunk_in_causal_order(prefetch):
    stats = time_steps(10_000, tier="cpu", chunk_numel=1_500, prefetch=prefetch, steps=2)
    assert [s.bytes_read for s in stats] == [0, 8 * 10_000]
    last = stats[-1]
    assert last.chunks == 7  # 6 of 1,500 and one of 1,000
    for k in range(7):
        spans = {s.kind: s for s in last.spans if s.chunk == k and s.kind != "wait"}
        assert set(spans) == {"read", "update", "write"}
        # update waits for the read's result; the write is submitted after the update
        assert spans["read"].end <= spans["update"].start <= spans["update"].end
        assert spans["update"].end <= spans["write"].start
        assert spans["update"].lane == "main"
        assert spans["read"].lane == spans["write"].lane == ("io" if prefetch else "main")


def test_bad_arguments_say_what_is_wrong():
    params = TinyMLP(**MLP).parameters
    with pytest.raises(TypeError, match="optimizer_class must be a torch.optim.Optimizer"):
        OffloadOptimizer(params(), "adam")
    with pytest.raises(ValueError, match="chunk_numel must be an int >= 1"):
        OffloadOptimizer(params(), torch.optim.Adam, chunk_numel=0)
    with pytest.raises(ValueError, match="tier must be one of"):
        OffloadOptimizer(params(), torch.optim.Adam, tier="gpu")
    mixed = [nn.Parameter(torch.zeros(3)), nn.Parameter(torch.zeros(3, dtype=torch.float64))]
    with pytest.raises(ValueError, match="share one dtype"):
        OffloadOptimizer(mixed, torch.optim.Adam, tier="cpu")
    if gpu_count() == 0:
        with pytest.raises(ValueError, match="pin=True needs a GPU"):
            HostStore(pin=True)
    with pytest.raises(ValueError, match="latency >= 0"):
        ThrottledStore(HostStore(), latency=0, bandwidth=0)
    store = HostStore()
    store.allocate("x", 4, torch.float32)
    with pytest.raises(ValueError, match="holds 4 torch.float32"):
        store.allocate("x", 5, torch.float32)


@pytest.mark.multirank
@pytest.mark.parametrize("world_size, tier", [(2, "nvme"), (3, "cpu")])
def test_each_zero2_rank_offloads_its_shard(world_size, tier):
    mlp = dict(d_in=16, d_hidden=64, d_out=5, depth=2)
    steps = 3
    results = run_sharded(world_size, mlp=mlp, steps=steps, tier=tier, chunk_numel=1000)
    psi = count_parameters(TinyMLP(**mlp))
    shard = shard_numel(psi, world_size)
    assert world_size * shard > psi  # padding: the last shard ends in zeros
    for r in results:
        assert r["equal"]  # bit for bit the in-memory ShardedOptimizer on the same rank
        assert r["shard_numel"] == shard and sum(r["chunks"]) == shard
        assert [(s.bytes_read, s.bytes_written) for s in r["steps"]] == [
            step_bytes(shard, state_bytes=8, first=i == 0) for i in range(steps)]
        assert r["tier_bytes"] == 8 * shard
        if tier == "nvme":
            assert r["file_bytes"] == {"exp_avg": 4 * shard, "exp_avg_sq": 4 * shard}
        assert r["held_offloaded"].optimizer == 0
        assert r["held_in_memory"].optimizer == 8 * shard
        # Offload moves states between tiers, not between ranks: the same collectives, bytes.
        assert r["sent_offloaded"] == r["sent_in_memory"] and r["sent_offloaded"]
    # ... and it trains like one process on the whole batch, up to float rounding.
    ref = TinyMLP(**mlp)
    opt = torch.optim.Adam(ref.parameters(), lr=1e-2)
    x, y = make_regression_data(BATCH, mlp["d_in"], mlp["d_out"])
    for _ in range(steps):
        opt.zero_grad()
        F.mse_loss(ref(x), y).backward()
        opt.step()
    for r in results:
        for a, b in zip(r["params"], ref.parameters()):
            torch.testing.assert_close(a, b.detach(), rtol=1e-5, atol=1e-6)


@pytest.mark.gpu
@pytest.mark.skipif(gpu_count() == 0, reason="needs a CUDA GPU")
@pytest.mark.parametrize("tier", ["cpu", "nvme"])
def test_on_a_gpu_pinned_or_mapped_and_equal(tier):
    dev = torch.device("cuda")
    x, y = make_regression_data(16, MLP["d_in"], MLP["d_out"], device=dev)
    model, ref = TinyMLP(**MLP, device=dev), TinyMLP(**MLP, device=dev)
    ref_opt = torch.optim.Adam(ref.parameters(), lr=1e-2, foreach=False)
    with OffloadOptimizer(model.parameters(), torch.optim.Adam, tier=tier, chunk_numel=64,
                          lr=1e-2, foreach=False) as opt:
        if tier == "cpu":
            assert opt.store.pin
        for _ in train(model, opt, 3, x, y):
            ref_opt.zero_grad()
            F.mse_loss(ref(x), y).backward()
            ref_opt.step()
        assert all(torch.equal(a, b) for a, b in zip(model.parameters(), ref.parameters()))
