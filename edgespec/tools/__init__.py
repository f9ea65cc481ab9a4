"""Tools around edgespec that are not part of decoding: `channel` (a network link emulator,
a TCP proxy adding delay, jitter, a bandwidth cap and loss, for split-decoding tests and
benchmarks). Stdlib only."""
