"""Split decoding, the device's side, in three layers named by role: `fallback.FallbackVerifier`
(the decode loop's verifier: the server while it answers, else the local graphs) holds its
`server`, a `verifier.RemoteVerifier` (each round as a VERIFY), which holds its `session`, a
`session.Remote` (START / VERIFY / END over one `websocket.Link`); `listen.py` reads a server's
stream."""
