"""Tiny random encoder configs, one per family opreg-transformers' encoder loader knows: the
checkpoints tests/test_checkpoint_encoders.py exports, and bench/optimum_compare.py writes with an
older transformers (this module imports transformers only, so that any venv holding it can use it).
"""

from __future__ import annotations

import transformers

SIZES = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=37)
CONFIGS = {
    "albert": lambda: transformers.AlbertConfig(vocab_size=64, embedding_size=16, max_position_embeddings=40, **SIZES),
    "bert": lambda: transformers.BertConfig(vocab_size=64, max_position_embeddings=40, **SIZES),
    "camembert": lambda: transformers.CamembertConfig(
        vocab_size=64, max_position_embeddings=42, pad_token_id=1, **SIZES
    ),
    "convbert": lambda: transformers.ConvBertConfig(
        vocab_size=64, embedding_size=32, max_position_embeddings=40, **SIZES
    ),
    "data2vec-text": lambda: transformers.Data2VecTextConfig(
        vocab_size=64, max_position_embeddings=42, pad_token_id=1, **SIZES
    ),
    "deberta-v2": lambda: transformers.DebertaV2Config(
        vocab_size=64,
        max_position_embeddings=40,
        relative_attention=True,
        position_buckets=8,
        pos_att_type=["p2c", "c2p"],
        position_biased_input=False,
        **SIZES,
    ),  # as DeBERTa-v3 is configured: relative positions only, no token types
    "distilbert": lambda: transformers.DistilBertConfig(
        vocab_size=64, dim=32, n_layers=2, n_heads=2, hidden_dim=37, max_position_embeddings=40
    ),
    "electra": lambda: transformers.ElectraConfig(
        vocab_size=64, embedding_size=16, max_position_embeddings=40, **SIZES
    ),
    "modernbert": lambda: transformers.ModernBertConfig(
        vocab_size=64,
        max_position_embeddings=40,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=36,
        pad_token_id=0,
    ),
    "mpnet": lambda: transformers.MPNetConfig(vocab_size=64, max_position_embeddings=42, **SIZES),
    "rembert": lambda: transformers.RemBertConfig(
        vocab_size=64, max_position_embeddings=40, input_embedding_size=16, output_embedding_size=16, **SIZES
    ),
    "roberta": lambda: transformers.RobertaConfig(vocab_size=64, max_position_embeddings=42, pad_token_id=1, **SIZES),
    "roformer": lambda: transformers.RoFormerConfig(
        vocab_size=64, embedding_size=32, max_position_embeddings=40, **SIZES
    ),
    "squeezebert": lambda: transformers.SqueezeBertConfig(
        vocab_size=64,
        max_position_embeddings=40,
        embedding_size=32,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=36,
        q_groups=2,
        k_groups=2,
        v_groups=2,
        post_attention_groups=2,
        intermediate_groups=2,
        output_groups=2,
    ),
    "xlm-roberta": lambda: transformers.XLMRobertaConfig(
        vocab_size=64, max_position_embeddings=42, pad_token_id=1, **SIZES
    ),
}
"""Tiny configs, one per family: 40 positions (42 where they start after the padding index 1)."""
