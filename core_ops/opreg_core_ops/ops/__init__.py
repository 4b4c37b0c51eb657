"""Core impls, one module per op family; each module's ``register`` adds its impls."""
