"""Imported by every verl process of ``benchmarks/vs_verl_gpu.py`` (``VERL_USE_EXTERNAL_MODULES``): registers roll's
padding-free attention (:mod:`roll.models.varlen`, PyTorch's flash varlen kernel) with transformers, so that verl's
``use_remove_padding`` path runs without the flash-attn package (absent on the GPU machine) and with the same
attention kernel as roll's training."""

from roll.models import varlen

varlen.register()
