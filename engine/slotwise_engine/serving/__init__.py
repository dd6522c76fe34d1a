"""Serving many requests at once: a continuous-batching scheduler over a ``ModelRunner``,
the engine that samples, stops and detokenizes for each request (``LLMEngine``), and its
asyncio front (``AsyncLLMEngine``)."""
