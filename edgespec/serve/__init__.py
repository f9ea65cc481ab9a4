"""Edge-cloud split decoding: the verifier server (`server`), its wire format (`protocol`),
and the device side (`client`, `split`). The server needs the [serve] extra (starlette,
uvicorn); the device side needs websockets, imported only when split mode is used."""
