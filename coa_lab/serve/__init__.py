"""`coa-lab serve`: the lab's OpenAI-compatible server (app.py assembles it and documents the API;
routes.py the endpoints, schema.py the request and reply bodies, batching.py the engine thread,
adapters.py runtime LoRA adapters) and the stand-in remote teacher the capture tests and notebook
01 use (stub_teacher.py)."""
