"""kvplan: exact KV-cache and weight accounting and capacity planning for LLM inference."""

__version__ = "0.1.0"
JSON_SCHEMA = 1
