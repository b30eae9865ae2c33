"""Tiny random HF Qwen3 checkpoints written by transformers itself (the independent reference)."""

# Three architectures that together cover tied/untied embeddings, GQA ratios 1 and 4, and a
# head_dim that differs from hidden_size / num_heads.
TINY_QWEN3 = {
    "tied_mha": dict(hidden_size=48, num_attention_heads=4, num_key_value_heads=4, head_dim=12,
                     tie_word_embeddings=True),
    "untied_gqa4": dict(hidden_size=64, num_attention_heads=8, num_key_value_heads=2, head_dim=16,
                        tie_word_embeddings=False),
    "untied_headdim": dict(hidden_size=40, num_attention_heads=4, num_key_value_heads=1, head_dim=24,
                           tie_word_embeddings=False, attention_bias=True),
}


def write_tiny_qwen3(out_dir, seed: int = 0, **overrides):
    """Write a random Qwen3 checkpoint with transformers' own save_pretrained; returns the torch model.

    Norm weights are perturbed away from 1 so their import is actually checked.
    """
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    kwargs = dict(vocab_size=101, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16, rope_theta=10000.0,
                  rms_norm_eps=1e-6, initializer_range=0.2, max_position_embeddings=256)
    kwargs.update(overrides)
    rope_theta = kwargs.pop("rope_theta")
    save_kwargs = {}
    if "max_shard_size" in kwargs:
        save_kwargs["max_shard_size"] = kwargs.pop("max_shard_size")
    config = Qwen3Config(**kwargs, rope_parameters={"rope_type": "default", "rope_theta": rope_theta})
    model = Qwen3ForCausalLM(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(0.3 * torch.randn_like(p))
    model.save_pretrained(out_dir, **save_kwargs)
    return model
