"""The model families and everything that builds, converts or cuts their weights. A new family goes here.

* ``families``: the registry of model families (``ModelFamily``): what each architecture is and which module builds it
* ``model``: the encoder family, RoBERTa-style masked LMs with secondary MLM heads (``RobertaMLM``)
* ``decoder``: the decoder family, GPT-2 and Llama-style causal LMs (``DecoderLM``)
* ``hf``, ``hf_decoder``: each family's bridge to and from Hugging Face ``transformers`` checkpoints
* ``outside``: the one door for models minimodel did not write (HF directories, hub ids, safetensors, GGUF files,
  their tokenizers): both families' ``from_hf`` and the tokenizer read through it; every failure the project's error
* ``gguf``: GGUF files (llama.cpp): where ``transformers``' loader reads one, and its header, read within its bounds
* ``decoder_task``: a finetuned decoder as a ``transformers`` sequence classifier, and its loader
* ``surgery``: cutting and joining models (the mini-model of a head, MiniPost's bridge, embedding swaps)
* ``focus``: FOCUS initialisation of new-language embeddings from overlapping tokens
"""
