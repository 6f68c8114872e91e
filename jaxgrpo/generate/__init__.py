"""On-device generation: sampling strategies, the KV-cache generator, and
examples generated and scored (`scored`)."""
