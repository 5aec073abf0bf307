"""Training loops (linear, one file per task), comparisons, and the run-directory contract."""
