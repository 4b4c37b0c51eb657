"""The decoder's input and output names, as ONNX Runtime GenAI reads them: :data:`LAYOUT`.

A module of its own (torch-free), so that the modules naming the decoder's inputs and outputs
(the cache, the folder, the families' exports) take the names from below, not from the package
that imports them (:mod:`opreg.llm` re-exports :data:`LAYOUT`).
"""

from __future__ import annotations

LAYOUT = {
    "input_ids": "input_ids",
    "attention_mask": "attention_mask",
    "position_ids": "position_ids",
    "past_key": "past_key_values.%d.key",
    "past_value": "past_key_values.%d.value",
    "logits": "logits",
    "present_key": "present.%d.key",
    "present_value": "present.%d.value",
    "past_conv": "past.%d.conv",
    "present_conv": "present.%d.conv",
}
"""The decoder's input and output names (``%d``: the layer), as ONNX Runtime GenAI's
``genai_config.json`` names them."""
