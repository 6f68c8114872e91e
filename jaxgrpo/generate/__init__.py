"""On-device generation: sampling strategies, the KV-cache sampler, and
examples generated and scored (`scored`)."""
