"""Split decoding, the device's side: the server as a verifier, its session and socket, the local
fallback, and listening to a server's stream."""
