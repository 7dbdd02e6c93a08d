"""The trainer's data side: prompts, the target-written dataset, and length-bucketed batches."""
