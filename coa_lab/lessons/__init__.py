"""What only the notebooks use: lesson inputs and reference figures (inputs.py), the ablation
runs of notebook 07 (ablations.py) and each lesson's self-checking exercises (exercises/)."""
