"""What torch's ONNX exporters write for a LLaMA-style model with a kv cache (the path
optimum's exporter takes), run on native-host against onnxruntime CPU and torch itself.

A tiny random ``LlamaForCausalLM`` (2 layers, GQA, tied embeddings) is exported once per
exporter: the TorchScript exporter (``dynamo=False``, opset 17) and, where onnxscript is
installed, the dynamo exporter (opset 20: GatherND, IsNaN, ...). The forward takes two new
tokens on a 3-token cache; logits and every present must agree within the tolerance table.
"""
from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from engines.native.array_backend import NumpyArrayBackend
from engines.native.plan import Plan, unsupported_ops
from harness.compare import compare_tensors

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
ort = pytest.importorskip("onnxruntime")

LAYERS, KV_HEADS, HEAD, PAST = 2, 2, 16, 3


def _tiny_llama():
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=LAYERS,
        num_attention_heads=4, num_key_value_heads=KV_HEADS, max_position_embeddings=64,
        tie_word_embeddings=True)
    return config, transformers.LlamaForCausalLM(config).eval()


class _WithCache(torch.nn.Module):
    """(input_ids, attention_mask, *past) -> (logits, *presents): flat tensors, so every
    exporter sees the cache as graph inputs and outputs."""

    def __init__(self, config, model):
        super().__init__()
        self.config, self.model = config, model

    def forward(self, input_ids, attention_mask, *past):
        cache = transformers.DynamicCache(config=self.config)
        for i in range(LAYERS):
            cache.update(past[2 * i], past[2 * i + 1], i)
        out = self.model(input_ids=input_ids, attention_mask=attention_mask,
                         past_key_values=cache, use_cache=True)
        presents = []
        for layer in out.past_key_values.layers:
            presents += [layer.keys, layer.values]
        return (out.logits, *presents)


EXPORTERS = [
    "torchscript",
    pytest.param("dynamo", marks=pytest.mark.skipif(
        importlib.util.find_spec("onnxscript") is None,
        reason="the dynamo exporter needs onnxscript (pip install onnxscript)")),
]


@pytest.fixture(scope="module", params=EXPORTERS)
def exported(request, tmp_path_factory):
    import onnx

    config, model = _tiny_llama()
    wrapper = _WithCache(config, model)
    ids = torch.tensor([[5, 9]])
    mask = torch.ones(1, PAST + 2, dtype=torch.long)
    gen = torch.Generator().manual_seed(1)
    past = tuple(torch.randn(1, KV_HEADS, PAST, HEAD, generator=gen) for _ in range(2 * LAYERS))
    names = [f"past.{i}.{kind}" for i in range(LAYERS) for kind in ("key", "value")]
    path = tmp_path_factory.mktemp("export") / f"llama_{request.param}.onnx"
    if request.param == "dynamo":
        torch.onnx.export(wrapper, (ids, mask, *past), str(path), dynamo=True,
                          input_names=["input_ids", "attention_mask", *names],
                          dynamic_shapes=({1: "seq"}, {1: "total"},
                                          tuple({2: "past"} for _ in names)))
    else:
        torch.onnx.export(wrapper, (ids, mask, *past), str(path), dynamo=False,
                          opset_version=17, input_names=["input_ids", "attention_mask", *names],
                          dynamic_axes={"input_ids": {1: "seq"}, "attention_mask": {1: "total"},
                                        **{n: {2: "past"} for n in names}})
    with torch.no_grad():
        reference = [t.numpy() for t in wrapper(ids, mask, *past)]
    feeds = {"input_ids": ids.numpy(), "attention_mask": mask.numpy(),
             **{n: p.numpy() for n, p in zip(names, past)}}
    return onnx.load(str(path)), feeds, reference


def test_torch_export_runs_on_native_host_and_matches(exported):
    model, feeds, reference = exported
    assert unsupported_ops(model) == []
    feeds = {k: v for k, v in feeds.items() if k in {i.name for i in model.graph.input}}
    native = Plan(model, NumpyArrayBackend()).run(feeds)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    onnxruntime_out = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))
    names = [o.name for o in model.graph.output]
    for name, torch_value in zip(names, reference):
        got = np.asarray(native[name])
        for against, want in (("ort-cpu", onnxruntime_out[name]), ("torch", torch_value)):
            result = compare_tensors(got, want, dtype="float32")
            assert result.ok, f"{name} vs {against}: {result.reason}"
