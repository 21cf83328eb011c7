"""Evaluation and calibration on the public dev sets (devsets.py), on cached dev-set knowledge bases (kb_cache.py):
retrieval (evaluate, fusion_cv), answers (answer_eval, small_kb_check, eval_followups) and the answer path's
fitted constants (gate_dataset + calibrate_gate, extractive_dataset + calibrate_extractive, calibrate_support)."""
