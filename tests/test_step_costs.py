"""docs/engines.md, a step's fixed costs per layer (t_L, t_X) and the engine's all-reduce (τ_c, docs/collectives.md):
the roofline record's t_l and the all-reduce lines by hand, a pipelined stage's share, NCCL's across nodes, and 0 as
nothing at all. The simulation against the plain event loop with them set is in tests/test_layouts.py and
tests/test_pipeline.py (per request, float64, 1e-9)."""

import numpy as np
import pytest

import slimjax
from slimjax.inputs import catalog
from slimjax.inputs.serving import default_serving
from slimjax.model import calculator, parallel, roofline
from slimjax.model.specs import GPUSpec, ModelSpec, stack


def _pair(model, gpu, **gpu_fields):
    g = {**catalog.resolve_gpu(gpu)[1], **gpu_fields}
    return stack(ModelSpec, [catalog.resolve_model(model)[1]]), stack(GPUSpec, [g])


def _one(a):
    return float(np.asarray(a).reshape(-1)[0])


@pytest.mark.parametrize("pp, stage_layers", [(1, 61), (2, 31), (4, 16)])
def test_layer_costs_by_hand(pp, stage_layers):
    """DeepSeek-V3 (61 layers, 58 of them routed): a step pays t_l + f·(61·t_L + 58·t_X) on its largest stage, f =
    ⌈61/n_pp⌉/61, and a pipelined engine's step n_pp times that (§10)."""
    t_l, t_L, t_X = 1e-3, 3e-5, 7e-5
    with slimjax.config.float64_scope():
        m, g = _pair("DeepSeek-V3", "H200")
        sv = default_serving(
            m, n_gpu=8.0, pp=float(pp), launch_overhead_s=t_l, layer_overhead_s=t_L,
            expert_layer_overhead_s=t_X,
        )  # fmt: skip
        roof, _, _ = calculator.roofline_terms(m, g, sv)
    f = stage_layers / 61
    assert _one(roof.launch_overhead_s) == pytest.approx(pp * (t_l + f * (61 * t_L + 58 * t_X)), rel=1e-12)


def test_zero_costs_leave_every_term_as_it_was():
    """t_L = t_X = τ_c = 0 given explicitly: the roofline record equals the default spec's, bit for bit."""
    m, g = _pair("Mixtral-8x7B", "H100-SXM")
    base, _, _ = calculator.roofline_terms(m, g, default_serving(m, n_gpu=4.0))
    zero = dict(layer_overhead_s=0.0, expert_layer_overhead_s=0.0, engine_allreduce_latency_s=0.0)
    given, _, _ = calculator.roofline_terms(m, g, default_serving(m, n_gpu=4.0, **zero))
    assert _one(given.launch_overhead_s) == _one(base.launch_overhead_s)
    for n in (1.0, 64.0, 8192.0):
        assert _one(roofline.comm_s(given, n)) == _one(roofline.comm_s(base, n))


def test_the_engines_allreduce_by_hand():
    """On 8 H200s (NCCL measured: τ_s 18.3 µs, B_s 124 GB/s, switch 8 MiB) the engine's τ_c replaces τ_s below the
    switch and nothing else: 2·L·(τ_c + x/B_s) for a decode step of B tokens, NCCL's large line from the switch."""
    tau_c = 5e-6
    with slimjax.config.float64_scope():
        m, g = _pair("Llama-3.1-70B", "H200")
        roof, _, _ = calculator.roofline_terms(m, g, default_serving(m, n_gpu=8.0, engine_allreduce_latency_s=tau_c))
        nccl, _, _ = calculator.roofline_terms(m, g, default_serving(m, n_gpu=8.0))
    gpu = catalog.resolve_gpu("H200")[1]
    D, L = 8192, 80
    for B in (1.0, 32.0, 256.0):
        x = B * D * 2.0
        want = 2 * L * (tau_c + x / gpu["allreduce_n8_small_bytes_per_s"])
        assert _one(roofline.comm_s(roof, B)) == pytest.approx(want, rel=1e-12)
        # NCCL's small latency is the only difference: 2·L·(τ_s − τ_c)
        gap = 2 * L * (gpu["allreduce_n8_small_latency_s"] - tau_c)
        assert _one(roofline.comm_s(nccl, B)) - _one(roofline.comm_s(roof, B)) == pytest.approx(gap, rel=1e-9)
    big = 8 * 2.0**20 / (D * 2.0) * 2  # past the switch: NCCL's large protocol, as measured
    assert _one(roofline.comm_s(roof, big)) == _one(roofline.comm_s(nccl, big))


def test_the_engines_allreduce_stays_inside_one_nvlink_domain():
    """A group wider than a node (n > gpus_per_node) keeps NCCL's (or §4c's) latency whatever τ_c: the custom
    kernels write into their peers' memory over NVLink and do not cross the network."""
    with slimjax.config.float64_scope():
        m, g = _pair("Llama-3.1-70B", "H200", gpus_per_node=4.0)
        fixed, *_ = parallel.tp_comm_segments(m.n_layers, m.hidden, 8.0, g, engine_latency_s=5e-6)
        base, *_ = parallel.tp_comm_segments(m.n_layers, m.hidden, 8.0, g)
        inside, *_ = parallel.tp_comm_segments(m.n_layers, m.hidden, 4.0, g, engine_latency_s=5e-6)
    assert _one(fixed) == _one(base)
    assert _one(inside) == pytest.approx(2 * 80 * 5e-6, rel=1e-12)


def test_step_costs_are_checked_by_name():
    from slimjax.errors import SlimjaxError
    from slimjax.inputs.serving import check_serving_value

    for key in ("layer_overhead_s", "expert_layer_overhead_s", "engine_allreduce_latency_s"):
        with pytest.raises(SlimjaxError, match=f"serving.{key}"):
            check_serving_value(key, -1e-6, f"serving.{key}")


def test_the_calibrated_preset_takes_each_engines_step_costs():
    """`efficiency: calibrated` with `engine: X` fills every step cost configs/roofline/default.yaml fitted for X
    (identified, physical), 0 where its fit ended at the bound 0, the block's default (the fitted engines' mean) where
    its rows cannot tell it apart; none for `generic`; the label names each (`t_L vllm`)."""
    from slimjax.inputs import serving as keys
    from slimjax.inputs.catalog import config_yaml

    doc = config_yaml("roofline/default.yaml")
    for key, short in keys.ENGINE_STEP_COSTS.items():
        for engine, entry in ((doc.get(key) or {}).get("engines") or {}).items():
            values, label = keys.calibrated_efficiency("H200", engine)
            if entry["identified"]:
                assert values[key] == entry["value"] and f"{short} {engine}" in label
            elif entry["at_bound"] or "default" not in doc[key]:
                assert keys.calibrated_step_cost(engine, key) == (0.0, "")
            else:
                assert values[key] == doc[key]["default"] and f"{short} {engine}: the engines' mean" in label
    generic, _ = keys.calibrated_efficiency("H200", "generic")
    assert all(generic.get(k, 0.0) == 0.0 for k in keys.ENGINE_STEP_COSTS if k != "step_overhead_s")
