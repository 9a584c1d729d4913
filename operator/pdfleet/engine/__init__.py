"""vLLM-compatible engine emulator: HTTP API, PD KV handshake, timing model, vLLM metrics, fault injection."""
