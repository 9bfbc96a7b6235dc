"""Tiny random llama-family models and left-padded batches, for the tests of the lean forward pass
(test_lean_decoder.py) and of its CUDA-graph decode steps (test_cuda_graphs.py)."""

from __future__ import annotations

TINY = dict(vocab_size=97, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=128, head_dim=16, max_position_embeddings=256)


def random_model(architecture, **overrides):
    """A tiny causal LM of `architecture` with random (seeded) weights."""
    import torch
    import transformers

    config_class, model_class = {
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
        "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),  # q/k/v projections with bias
        "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM),  # q_norm and k_norm
        "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM),
    }[architecture]
    torch.manual_seed(0)
    config = config_class(**(TINY | {"sliding_window": None} | overrides))
    return model_class(config).eval()


def reference_logits(model, sequences):
    """Transformers' own last-position logits for each sequence, run alone without padding."""
    import torch

    return torch.stack([model(torch.tensor([sequence])).logits[0, -1].float() for sequence in sequences])


def left_padded(prompts):
    """(input ids, attention mask, positions) of `prompts` left-padded to the longest."""
    import torch

    width = max(len(prompt) for prompt in prompts)
    input_ids = torch.zeros((len(prompts), width), dtype=torch.long)
    attention = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        input_ids[row, width - len(prompt):] = torch.tensor(prompt)
        attention[row, width - len(prompt):] = 1
    return input_ids, attention, (attention.cumsum(-1) - 1).clamp(min=0)
