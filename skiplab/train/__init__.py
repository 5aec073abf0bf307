"""Training loops, linear, one file per task, and the run-directory life cycle they share (run.py)."""
