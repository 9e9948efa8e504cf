"""Evaluation: perplexity, lm-eval downstream accuracy, confidence calibration and drift."""
