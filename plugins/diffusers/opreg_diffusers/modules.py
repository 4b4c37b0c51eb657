"""The pipeline's models wrapped as opreg exports them: each ``forward`` takes the ONNX inputs by
name and returns the outputs by optimum's names (:class:`TextEncoder`, :class:`Denoiser`,
:class:`VaeEncoder`, :class:`VaeDecoder`).

Imports torch: a component's ``build`` imports this module when the export reaches it.
"""

from __future__ import annotations

import torch


class TextEncoder(torch.nn.Module):
    """A text encoder whose outputs are named as optimum names them: its ``ModelOutput``'s fields
    and, with ``hidden_states``, every layer's as ``hidden_states.0`` ... ``hidden_states.N``."""

    def __init__(self, model: torch.nn.Module, hidden_states: bool = False) -> None:
        super().__init__()
        self.model = model
        self.hidden_states = hidden_states

    def forward(self, input_ids: torch.Tensor) -> dict[str, torch.Tensor]:
        output = self.model(input_ids=input_ids, output_hidden_states=self.hidden_states)
        named = {key: value for key, value in output.items() if key != "hidden_states"}
        if self.hidden_states:
            named.update({f"hidden_states.{i}": value for i, value in enumerate(output.hidden_states)})
        return named


class Denoiser(torch.nn.Module):
    """The UNet or the transformer, called with its inputs by name; ``added`` are those a UNet takes
    in its ``added_cond_kwargs`` (SDXL's ``text_embeds`` and ``time_ids``). Its prediction is
    named ``output``."""

    def __init__(self, model: torch.nn.Module, output: str, added: tuple[str, ...] = ()) -> None:
        super().__init__()
        self.model = model
        self.output = output
        self.added = added

    def forward(self, **inputs: torch.Tensor) -> dict[str, torch.Tensor]:
        added = {name: inputs.pop(name) for name in self.added if name in inputs}
        if added:
            inputs["added_cond_kwargs"] = added
        return {self.output: self.model(**inputs, return_dict=False)[0]}


class VaeEncoder(torch.nn.Module):
    """The VAE's encoder: the image's latent distribution as its parameters (mean and log-variance,
    concatenated on the channels), from which a runtime samples or takes the mode."""

    def __init__(self, vae: torch.nn.Module) -> None:
        super().__init__()
        self.vae = vae

    def forward(self, sample: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"latent_parameters": self.vae.encode(sample).latent_dist.parameters}


class VaeDecoder(torch.nn.Module):
    """The VAE's decoder: latents (already unscaled by the pipeline) to the image."""

    def __init__(self, vae: torch.nn.Module) -> None:
        super().__init__()
        self.vae = vae

    def forward(self, latent_sample: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"sample": self.vae.decode(latent_sample).sample}
