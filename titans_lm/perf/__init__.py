"""Performance accounting: analytic FLOP counts per backbone (:mod:`titans_lm.perf.flops`)."""
