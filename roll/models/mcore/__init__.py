"""Megatron-core models for roll: HF config -> ``TransformerConfig``/``GPTModel`` and HF <-> mcore weights.

``convert`` is pure tensor code (no megatron import): names and layouts of Qwen2/Qwen2.5 and Llama weights in
Hugging Face and in megatron-core's local layer spec, and their tensor-parallel shards. ``build`` imports
megatron-core and is used only by the ``megatron_train`` / ``megatron_infer`` strategies.
"""
