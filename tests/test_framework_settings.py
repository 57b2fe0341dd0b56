"""toolkit.framework_settings: a DeepSpeed config JSON read as the course's Layout (DeepSpeed's
batch identity and defaults), the bytes of a layout against the ZeRO paper's published numbers,
and the settings table."""

from __future__ import annotations

import pytest

from toolkit.framework_settings import (
    SETTINGS, Layout, deepspeed_config, from_deepspeed, layout_bytes)
from toolkit.memory import FP32_ADAM, GB, MIXED_ADAM


def test_a_written_config_reads_back_as_its_layout():
    cfg = deepspeed_config(micro_batch=4, accumulation=2, world_size=8, stage=2, bf16=True,
                           offload_optimizer="cpu")
    assert cfg["train_batch_size"] == 64 and cfg["gradient_clipping"] == 0.0
    layout = from_deepspeed(cfg, world_size=8)
    assert layout == Layout(dp=8, zero_stage=2, micro_batch=4, accumulation=2, recipe=MIXED_ADAM,
                            offload_optimizer="cpu", clip=0.0)
    assert layout.global_batch == 64


def test_deepspeeds_rules_two_of_three_batch_keys_and_the_clipping_default():
    # Any two of B, b, k give the third (DeepSpeed's config page).
    assert from_deepspeed({"train_batch_size": 32, "gradient_accumulation_steps": 2},
                          world_size=4).micro_batch == 4
    assert from_deepspeed({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 2},
                          world_size=4).accumulation == 4
    layout = from_deepspeed({"train_micro_batch_size_per_gpu": 2}, world_size=4)
    assert (layout.accumulation, layout.clip, layout.recipe) == (1, 1.0, FP32_ADAM)
    with pytest.raises(ValueError, match="batch identity"):
        from_deepspeed({"train_batch_size": 30, "train_micro_batch_size_per_gpu": 4,
                        "gradient_accumulation_steps": 2}, world_size=4)
    with pytest.raises(ValueError, match="give train_batch_size"):
        from_deepspeed({}, world_size=4)


def test_layout_bytes_are_the_zero_papers():
    # ZeRO Fig. 1: Ψ = 7.5B, N_d = 64, mixed-precision Adam: 120 GB, 31.4 GB, 16.6 GB, 1.9 GB.
    published = {0: 120, 1: 31.4, 2: 16.6, 3: 1.88}
    for stage, gb in published.items():
        layout = Layout(dp=64, zero_stage=stage, recipe=MIXED_ADAM)
        assert layout_bytes(layout, num_params=7.5e9).device / GB == pytest.approx(gb, rel=0.01)
    # Offloading moves the optimizer states (12Ψ/N_d at stages 1-3) to the host.
    off = layout_bytes(Layout(dp=64, zero_stage=2, recipe=MIXED_ADAM, offload_optimizer="cpu"),
                       num_params=7.5e9)
    assert off.host == pytest.approx(12 * 7.5e9 / 64)
    # Traffic per step: 2Ψ elements of g bytes for stages 0-2, 3Ψ for stage 3, times (d-1)/d.
    assert layout_bytes(Layout(dp=2, recipe=MIXED_ADAM), num_params=1e9).sent_per_step == 2e9
    assert layout_bytes(Layout(dp=2, zero_stage=3, recipe=MIXED_ADAM),
                        num_params=1e9).sent_per_step == 3e9


def test_bad_layouts_are_refused_with_the_reason():
    with pytest.raises(ValueError, match="needs ZeRO stage 3"):
        Layout(dp=2, zero_stage=2, offload_params="cpu")
    with pytest.raises(ValueError, match="offload_optimizer must be one of"):
        Layout(dp=2, offload_optimizer="disk")
    with pytest.raises(ValueError, match="stage must be one of"):
        deepspeed_config(micro_batch=1, accumulation=1, world_size=2, stage=4)


def test_the_settings_table_covers_four_frameworks_with_links():
    frameworks = {s.framework for s in SETTINGS}
    assert frameworks == {"DeepSpeed", "Accelerate", "torchtitan", "Megatron-Core"}
    assert all(s.doc.startswith("https://") and s.concept and s.effect for s in SETTINGS)
    keys = {s.key for s in SETTINGS}
    for key in ("zero_optimization.stage", "gradient_accumulation_steps", "bf16.enabled",
                "parallelism.tensor_parallel_degree", "virtual_pipeline_model_parallel_size"):
        assert key in keys


def test_the_explorer_view_shows_the_json_and_what_deepspeed_reads_from_it():
    from toolkit.widgets.frameworks import DeepSpeedExplorer, deepspeed_view

    fig, html = deepspeed_view(num_params=7e9, dp=8, stage=2, offload="cpu")
    assert "&quot;offload_optimizer&quot;" in html and "gradient_clipping = 1" in html
    assert [bar.x for bar in fig.data if bar.type == "bar"][0] == tuple(
        f"stage {s}" for s in range(4))
    _, html0 = deepspeed_view(stage=0, offload="cpu")
    assert "stage 0 cannot offload" in html0 and "&quot;offload_optimizer&quot;" not in html0
    explorer = DeepSpeedExplorer()
    explorer.stage.value = 3
    assert "Stage 3:" in explorer.verdict.value
    with pytest.raises(ValueError, match="offload must be one of"):
        deepspeed_view(offload="disk")
