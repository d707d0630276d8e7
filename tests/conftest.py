"""Shared test setup. Nothing in the test suite may reach the network or a model hub."""

import os

# Set before transformers/huggingface_hub are imported anywhere: a typo'd model name must
# fail fast with our error, not hang on a connection attempt.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
