"""Order-insensitive operators of the OOP architecture, one module each."""
