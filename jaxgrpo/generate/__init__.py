"""On-device generation: sampling strategies and the KV-cache generator."""
