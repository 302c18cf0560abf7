"""Serving requests on a Runner: the one generation loop (`generation`), sampling, a session (a model
with its tokenizer and chat template), the request queue (`scheduler`), the request shapes every face
validates against (`protocol`), the site Worker's whole Python API (`worker_api`) and the Python API's
backend inside a PyScript page (`js_engine`).
May import: everything before it (pyshim.errors … pyshim.exec); never pyshim.setup, cli or api."""
