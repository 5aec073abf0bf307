"""Where a connection sits: the Place every model hands its connections, and its checks."""

import pytest

from skiplab import Place, connection
from skiplab.models import GPT, GPTConfig, PreActResNet, PreActResNetConfig, Transformer, TransformerConfig


def test_a_place_knows_its_stack_depth_architecture_and_index():
    p = Place(3, "encoder", 6, 4, sublayer=2, sublayers=2, role="ffn")
    assert (p.layers, p.architecture, p.index) == (6, "encoder-decoder", 6)  # (3 - 1) * 2 + 2
    d = Place.decoder_only(5, 12, 1, 2, "attn")
    assert (d.layers, d.architecture, d.index) == (12, "decoder-only", 9)
    assert Place().architecture == "encoder-only" and Place().layers == 1


@pytest.mark.parametrize("kwargs, message", [
    (dict(stack="middle"), "stack must be one of encoder, decoder, got 'middle'"),
    (dict(layer=7, encoder_layers=6), "layer 7 is outside the encoder stack's 1..6"),
    (dict(stack="decoder"), "the decoder stack has 0 layers"),
    (dict(sublayer=3, sublayers=2), "sub-layer 3 is outside its layer's 1..2"),
    (dict(role="attention"), "role must be one of attn, cross, ffn, block, got 'attention'"),
])
def test_a_place_outside_its_stack_is_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Place(**kwargs)


def test_models_hand_each_connection_its_place():
    gpt = GPT(GPTConfig(vocab_size=20, d_model=16, heads=2, layers=3, ffn_dim=32, context=8))
    assert [(layer.conn_attn.place.index, layer.conn_mlp.place.index) for layer in gpt.layers] == [(1, 2), (3, 4), (5, 6)]
    assert {layer.conn_mlp.place.architecture for layer in gpt.layers} == {"decoder-only"}
    mt = Transformer(TransformerConfig(vocab_size=20, d_model=16, heads=2, ffn_dim=32, encoder_layers=2,
                                       decoder_layers=3))
    last = mt.decoder.layers[2]
    assert [c.place.role for c in (last.conn_self, last.conn_cross, last.conn_ffn)] == ["attn", "cross", "ffn"]
    assert (last.conn_ffn.place.layers, last.conn_ffn.place.index, last.conn_ffn.place.architecture) == (3, 9,
                                                                                                       "encoder-decoder")
    assert mt.encoder.layers[1].conn_ffn.place == Place(2, "encoder", 2, 3, 2, 2, "ffn")
    resnet = PreActResNet(PreActResNetConfig(depth=20))
    assert [b.conn.place.layer for b in resnet.blocks] == list(range(1, 10))
    assert resnet.blocks[0].conn.place.architecture == "encoder-only"


def test_a_connection_shows_its_layer_where_it_has_one():
    assert "layer" not in repr(connection("PreLN", 8))
    assert "layer=2/5" in repr(connection("PreLN", 8, place=Place(2, "encoder", 5)))
