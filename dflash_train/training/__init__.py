"""The training process: the process shell (process.py: lock, signals, ranks, the stream's
run_end), one training run (run.py, resume.py) and its step loop (loop.py). The pipeline's
stages (sources, pool, target workers, drafter step, monitor) live in pipeline/."""
