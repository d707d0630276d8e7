"""Stage 1, capture: the multi-agent teacher (teacher.py) run on tasks, every agent activation
recorded to a traces file (recorder.py), with the few-shot worked examples it is prompted with."""
