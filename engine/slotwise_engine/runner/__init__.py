"""Running compiled models: static input buffers, graph capture, the model runner."""
