"""Tiny random encoder configs, one per family opreg-transformers' encoder loader knows: the
checkpoints tests/test_checkpoint_encoders.py exports, and bench/optimum_compare.py writes with an
older transformers (this module imports transformers only, so that any venv holding it can use it).
"""

from __future__ import annotations

import transformers

SIZES = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=37)
LILT_SIZES = {**SIZES, "hidden_size": 48}
"""LiLT's layout embeddings concatenate six of ``hidden_size // 6``."""
CONFIGS = {
    "albert": lambda: transformers.AlbertConfig(vocab_size=64, embedding_size=16, max_position_embeddings=40, **SIZES),
    "bert": lambda: transformers.BertConfig(vocab_size=64, max_position_embeddings=40, **SIZES),
    "big_bird": lambda: transformers.BigBirdConfig(
        vocab_size=64, max_position_embeddings=40, sep_token_id=3, block_size=2, num_random_blocks=3, **SIZES
    ),  # block-sparse attention of 2-token blocks: full up to (5 + 2 * 3) * 2 = 22 tokens
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
    "deberta": lambda: transformers.DebertaConfig(
        vocab_size=64,
        max_position_embeddings=40,
        relative_attention=True,
        pos_att_type=["c2p", "p2c"],
        position_biased_input=False,
        type_vocab_size=0,
        pooler_hidden_size=32,
        **SIZES,
    ),  # as microsoft/deberta-base is configured
    "distilbert": lambda: transformers.DistilBertConfig(
        vocab_size=64, dim=32, n_layers=2, n_heads=2, hidden_dim=37, max_position_embeddings=40
    ),
    "electra": lambda: transformers.ElectraConfig(
        vocab_size=64, embedding_size=16, max_position_embeddings=40, **SIZES
    ),
    "esm": lambda: transformers.EsmConfig(
        vocab_size=64,
        max_position_embeddings=42,
        pad_token_id=1,
        mask_token_id=4,
        position_embedding_type="rotary",
        token_dropout=True,
        emb_layer_norm_before=False,
        **SIZES,
    ),  # as ESM-2 is configured
    "ibert": lambda: transformers.IBertConfig(vocab_size=64, max_position_embeddings=42, pad_token_id=1, **SIZES),
    "layoutlm": lambda: transformers.LayoutLMConfig(
        vocab_size=64, max_position_embeddings=40, max_2d_position_embeddings=64, **SIZES
    ),
    "lilt": lambda: transformers.LiltConfig(
        vocab_size=64, max_position_embeddings=42, pad_token_id=1, max_2d_position_embeddings=64, **LILT_SIZES
    ),
    "markuplm": lambda: transformers.MarkupLMConfig(
        vocab_size=64, max_position_embeddings=42, pad_token_id=1, max_depth=4, xpath_unit_hidden_size=8, **SIZES
    ),
    "megatron-bert": lambda: transformers.MegatronBertConfig(vocab_size=64, max_position_embeddings=40, **SIZES),
    "mobilebert": lambda: transformers.MobileBertConfig(
        vocab_size=64,
        max_position_embeddings=40,
        embedding_size=16,
        intra_bottleneck_size=16,
        num_feedforward_networks=2,
        **SIZES,
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
    "nystromformer": lambda: transformers.NystromformerConfig(
        vocab_size=64, max_position_embeddings=42, segment_means_seq_len=8, num_landmarks=8, **SIZES
    ),  # positions start at 2; as many landmarks as segment means: full attention at every length
    "rembert": lambda: transformers.RemBertConfig(
        vocab_size=64, max_position_embeddings=40, input_embedding_size=16, output_embedding_size=16, **SIZES
    ),
    "roberta": lambda: transformers.RobertaConfig(vocab_size=64, max_position_embeddings=42, pad_token_id=1, **SIZES),
    "roformer": lambda: transformers.RoFormerConfig(
        vocab_size=64, embedding_size=32, max_position_embeddings=40, **SIZES
    ),
    "splinter": lambda: transformers.SplinterConfig(
        vocab_size=64, max_position_embeddings=40, question_token_id=5, **SIZES
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
    "xlm": lambda: transformers.XLMConfig(
        vocab_size=64, emb_dim=32, n_layers=2, n_heads=2, max_position_embeddings=40, pad_index=2
    ),
    "flaubert": lambda: transformers.FlaubertConfig(
        vocab_size=64, emb_dim=32, n_layers=2, n_heads=2, max_position_embeddings=40, pad_index=2
    ),
    "xlm-roberta": lambda: transformers.XLMRobertaConfig(
        vocab_size=64, max_position_embeddings=42, pad_token_id=1, **SIZES
    ),
}
"""Tiny configs, one per family: 40 positions (42 where they start after the padding index 1, or at 2);
BigBird's block-sparse attention is full up to 22 tokens, and exported so."""
