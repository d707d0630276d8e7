"""`coa-lab serve`: the lab's OpenAI-compatible server (app.py: schema, batching, LoRA adapters)
and the stand-in remote teacher the capture tests and notebook 01 use (stub_teacher.py)."""
