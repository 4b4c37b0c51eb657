"""Core impls, one module per op family; each impl carries its registration (``@opreg.impl``) on its def."""
