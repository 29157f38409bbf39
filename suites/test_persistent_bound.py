"""The persistent-kernel bound's stage table (``scripts/gpu_persistent_bound.py``, issue 37)
reads what a SmolLM2-135M float16 decode step reads: the probe's floor is the engine's."""
from scripts.gpu_persistent_bound import stage_bytes
from suites.decode_chain import SMOLLM2

# SmolLM2-135M's 134,515,008 parameters less its 61 norm gains of 576 (not in any GEMV)
GEMV_PARAMETERS = 134_515_008 - 61 * 576


def test_the_stages_are_five_a_layer_and_the_head():
    assert len(stage_bytes()) == 5 * SMOLLM2.layers + 1


def test_the_stages_read_every_weight_once_and_the_cache_to_the_position():
    sizes = stage_bytes(position=128)
    cache = SMOLLM2.layers * 2 * SMOLLM2.kv_heads * SMOLLM2.head_dim * 128 * 2
    assert sum(sizes) - cache == 2 * GEMV_PARAMETERS
    assert sum(stage_bytes(position=64)) == sum(sizes) - cache // 2
