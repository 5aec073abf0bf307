"""The room for outside formats: one small module per format (``hf``: Hugging Face's GPT-2 and LLaMA models;
``lm_eval``: a trained run as an lm-evaluation-harness model).

``loggers``: TensorBoard, W&B and trackio for ``--logger``. They import their outside package inside the functions
that need it, so skiplab runs without them; a missing package is a one-line error naming the extra to install. The
core imports none of them but ``loggers``, which the training loop opens (its packages only when a logger is named).
"""
