"""Text generation with the models' carried state: sampling (``sampling``), the prefill/decode
loop (``decode``) and ``titans-lm generate`` (``run``)."""
