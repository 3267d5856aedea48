"""The reference model: a tiny, randomly initialised Qwen2.5-Omni thinker.

The architecture is transformers' own ``Qwen2_5OmniThinkerForConditionalGeneration``
(vision encoder with window attention, Whisper-style audio encoder, Qwen2
language model with 3-D rotary positions), built from a configuration made
in code with every size shrunk, so that it runs in milliseconds on a CPU and
needs no download. What must match the real checkpoint does: the vision
patch (14 px), spatial merge (2) and temporal patch (2), the 128 mel bins
and the audio encoder's two convolutions and pooling. Those decide how many
placeholder tokens an image or a clip becomes, and so the counts.

There is no tokenizer download either: text is byte-level (one token per
UTF-8 byte, ids 0-255) and the chat-template tokens of Qwen2.5-Omni get the
ids after that (:data:`SPECIAL`).
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "AUDIO",
    "AUDIO_BOS",
    "AUDIO_EOS",
    "EOS",
    "IMAGE",
    "IM_END",
    "IM_START",
    "PAD",
    "SPECIAL",
    "VIDEO",
    "VISION_BOS",
    "VISION_EOS",
    "VOCAB_SIZE",
    "build_model",
    "decode_text",
    "encode_text",
    "render_chat",
    "tiny_thinker_config",
]

# Special tokens, named as in the Qwen2.5-Omni tokenizer, after the 256 bytes.
IM_START = 256
IM_END = 257
VISION_BOS = 258  # <|vision_bos|> (vision_start_token_id)
VISION_EOS = 259
AUDIO_BOS = 260  # <|audio_bos|> (audio_start_token_id)
AUDIO_EOS = 261
IMAGE = 262  # <|IMAGE|>
AUDIO = 263  # <|AUDIO|>
VIDEO = 264  # <|VIDEO|>
PAD = 265  # <|endoftext|>
#: Generation stops at ``<|im_end|>``, as Qwen's generation config says.
EOS = IM_END
#: Special token text -> id.
SPECIAL: dict[str, int] = {
    "<|im_start|>": IM_START,
    "<|im_end|>": IM_END,
    "<|vision_bos|>": VISION_BOS,
    "<|vision_eos|>": VISION_EOS,
    "<|audio_bos|>": AUDIO_BOS,
    "<|audio_eos|>": AUDIO_EOS,
    "<|IMAGE|>": IMAGE,
    "<|AUDIO|>": AUDIO,
    "<|VIDEO|>": VIDEO,
    "<|endoftext|>": PAD,
}
VOCAB_SIZE = 272  # 256 bytes + 10 specials, rounded up to a multiple of 8


def encode_text(text: str) -> list[int]:
    """Byte-level token ids of ``text``."""
    return list(text.encode("utf-8"))


def decode_text(ids: list[int]) -> str:
    """The text of byte tokens; special tokens are skipped, bad UTF-8 replaced."""
    return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")


def render_chat(messages: list[tuple[str, list[tuple[str, str]]]]) -> list[int]:
    """Token ids of a conversation in the Qwen2.5-Omni chat template.

    Args:
        messages: ``(role, parts)`` pairs, each part ``("text", text)``,
            ``("image", "")`` or ``("audio", "")``.

    Returns:
        ``<|im_start|>{role}\\n{content}<|im_end|>\\n`` per message and the
        generation prompt ``<|im_start|>assistant\\n``; an image is
        ``<|vision_bos|><|IMAGE|><|vision_eos|>`` and a clip
        ``<|audio_bos|><|AUDIO|><|audio_eos|>``, one placeholder each, which
        the processor then expands. No default system prompt is added.
    """
    ids: list[int] = []
    for role, parts in messages:
        ids += [IM_START, *encode_text(f"{role}\n")]
        for kind, text in parts:
            if kind == "image":
                ids += [VISION_BOS, IMAGE, VISION_EOS]
            elif kind == "audio":
                ids += [AUDIO_BOS, AUDIO, AUDIO_EOS]
            else:
                ids += encode_text(text)
        ids += [IM_END, *encode_text("\n")]
    return [*ids, IM_START, *encode_text("assistant\n")]


def tiny_thinker_config() -> Any:
    """A ``Qwen2_5OmniThinkerConfig`` with the real geometry and tiny widths.

    Kept from ``Qwen/Qwen2.5-Omni-7B`` (they decide the token counts):
    vision ``patch_size`` 14, ``spatial_merge_size`` 2,
    ``temporal_patch_size`` 2, ``window_size`` 112; audio ``num_mel_bins``
    128, ``n_window`` 100, ``max_source_positions`` 1500. Shrunk: every
    width, depth and head count, and the vocabulary.
    """
    from transformers.models.qwen2_5_omni.configuration_qwen2_5_omni import (
        Qwen2_5OmniThinkerConfig,
    )

    return Qwen2_5OmniThinkerConfig(
        audio_config={
            "num_mel_bins": 128,
            "encoder_layers": 1,
            "encoder_attention_heads": 2,
            "encoder_ffn_dim": 64,
            "d_model": 32,
            "output_dim": 64,
            "n_window": 100,
            "max_source_positions": 1500,
        },
        vision_config={
            "depth": 2,
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_heads": 2,
            "out_hidden_size": 64,
            "fullatt_block_indexes": [1],
            "patch_size": 14,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            "window_size": 112,
        },
        text_config={
            "vocab_size": VOCAB_SIZE,
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "max_position_embeddings": 32768,
            # head_dim 32: the three M-RoPE sections cover its 16 frequencies.
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": 1_000_000.0,
                "mrope_section": [4, 6, 6],
            },
            "pad_token_id": PAD,
            "eos_token_id": EOS,
        },
        audio_token_index=AUDIO,
        image_token_index=IMAGE,
        video_token_index=VIDEO,
        audio_start_token_id=AUDIO_BOS,
        audio_end_token_id=AUDIO_EOS,
        vision_start_token_id=VISION_BOS,
        vision_end_token_id=VISION_EOS,
        user_token_id=encode_text("u")[0],
    )


def build_model(seed: int = 0, device: str = "cpu") -> Any:
    """The tiny thinker, randomly initialised from ``seed``, in eval mode on ``device``.

    The global torch RNG is left as it was.
    """
    import torch
    from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import (
        Qwen2_5OmniThinkerForConditionalGeneration,
    )

    config = tiny_thinker_config()
    # sdpa runs the vision and audio encoders' packed sequences without flash-attn.
    config._attn_implementation = "sdpa"
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2_5OmniThinkerForConditionalGeneration(config)
    return model.to(device).eval()
