"""The local verifier and the acceptance rules of speculative decoding (chains and token trees),
shared by the device and the server."""
