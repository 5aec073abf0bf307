"""The room for outside formats: one small module per format (``hf``: Hugging Face's GPT-2 and LLaMA models;
``lm_eval``: a trained run as an lm-evaluation-harness model).

The core never imports these modules, and they import their outside package inside the functions that need
it, so skiplab runs without them; a missing package is a one-line error naming the extra to install.
"""
