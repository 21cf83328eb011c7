"""Generated documentation: the README's settings table."""
