"""Model building blocks that are CustomOps: each platform may run its own kernel."""
