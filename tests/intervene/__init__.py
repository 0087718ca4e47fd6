"""Ablations, importance, pruning, scans, top-N deletion and streaming: equal to full forwards."""
