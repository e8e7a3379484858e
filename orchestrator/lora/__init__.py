"""LoRA adapters of the served base model: what one is (`adapter`), which the app serves (`catalog`), where
the served set is shared between frontends (`store`), and a tiny one made locally for tests (`tiny`)."""
