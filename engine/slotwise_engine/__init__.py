"""slotwise-engine: an inference engine on slotwise.

Hugging Face checkpoints (``slotwise_engine.models``), the model runner
(``slotwise_engine.runner``), generation, benchmarks (``slotwise_engine.bench``) and
the ``slotwise generate`` and ``slotwise bench`` commands (``slotwise_engine.cli``),
which the core's command line finds through the ``slotwise.cli_commands`` entry points.
"""
